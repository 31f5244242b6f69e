#include "viewers/image_view.hpp"

#include <QCoreApplication>
#include <QKeyEvent>
#include <QMouseEvent>
#include <QOpenGLContext>
#include <QSurfaceFormat>
#include <QThreadPool>
#include <QWheelEvent>

#include <algorithm>
#include <cmath>
#include <limits>

#include "viewers/image_renderer.hpp"

namespace gpuphot::viewers {

namespace {
constexpr double kMaxZoom = 64.0;
constexpr double kPickRadiusPx = 6.0;
} // namespace

ImageView::ImageView(QWidget* parent) : QOpenGLWidget(parent), m_renderer(std::make_unique<ImageRenderer>()) {
    if (QOpenGLContext::openGLModuleType() == QOpenGLContext::LibGL) {
        QSurfaceFormat f = format();
        f.setVersion(3, 3);
        f.setProfile(QSurfaceFormat::CoreProfile);
        setFormat(f);
    }
    setMouseTracking(true);
    setFocusPolicy(Qt::StrongFocus);
    setMinimumSize(64, 64);
}

ImageView::~ImageView() {
    m_lodToken.reset(); // a level build still running is dropped when it lands
    QObject::disconnect(m_contextConnection);
    if (m_renderer->initialized() && context()) {
        makeCurrent();
        m_renderer->destroy();
        doneCurrent();
    }
}

// ---- data -------------------------------------------------------------------------------------------

void ImageView::setLodMinPixels(std::int64_t pixels) {
    m_lodMinPixels = std::max<std::int64_t>(0, pixels);
}

void ImageView::setImage(std::shared_ptr<const Image<float>> image) {
    m_image = std::move(image);
    m_colour = {};
    m_colourSample = {};
    m_colourDirty = true;
    m_sample = m_image ? samplePixels(m_image->view()) : std::vector<float>{};
    m_imageDirty = true;
    m_lod.clear();
    m_lodDirty = false;
    m_lodToken.reset(); // a build still running for the previous image is dropped when it lands
    if (m_image && static_cast<std::int64_t>(m_image->width()) * m_image->height() >= m_lodMinPixels) {
        m_lodToken = std::make_shared<int>(0);
        const std::weak_ptr<int> token = m_lodToken;
        const std::shared_ptr<const Image<float>> img = m_image;
        const std::int64_t minPixels = m_lodMinPixels;
        QThreadPool::globalInstance()->start([this, token, img, minPixels] {
            auto levels = std::make_shared<std::vector<LodLevel>>(buildLodLevels(img->view(), minPixels));
            // Back on the UI thread; the token (reset only there) says whether this view and image still
            // exist.
            QMetaObject::invokeMethod(
                qApp,
                [this, token, levels] {
                    if (token.expired()) return;
                    m_lod = std::move(*levels);
                    m_lodDirty = true;
                    update();
                    emit lodReady();
                },
                Qt::QueuedConnection);
        });
    }
    if (m_seg) m_segDirty = true;
    recomputeLimits();
    m_fitPending = true;
    zoomToFit();
    update();
}

void ImageView::setColourPlanes(std::shared_ptr<const Image<float>> red, std::shared_ptr<const Image<float>> green,
                                std::shared_ptr<const Image<float>> blue) {
    m_colour = {std::move(red), std::move(green), std::move(blue)};
    bool ok = m_image != nullptr;
    for (const auto& c : m_colour)
        ok = ok && c && c->width() == m_image->width() && c->height() == m_image->height();
    if (!ok) m_colour = {};
    for (std::size_t k = 0; k < 3; ++k)
        m_colourSample[k] = m_colour[k] ? samplePixels(m_colour[k]->view()) : std::vector<float>{};
    m_colourDirty = true;
    recomputeLimits();
}

void ImageView::setColourShown(bool shown) {
    m_colourShown = shown;
    update();
    emit displayChanged();
}

void ImageView::recomputeLimits() {
    if (m_limitMode != LimitMode::Manual) {
        LimitRequest req;
        req.mode = m_limitMode;
        req.lowPercent = m_lowPercent;
        req.highPercent = m_highPercent;
        std::tie(m_lo, m_hi) = computeLimits(m_sample, req);
        for (std::size_t k = 0; k < 3; ++k)
            m_colourLimits[k] = m_colour[k] ? computeLimits(m_colourSample[k], req) : std::pair{m_lo, m_hi};
    } else {
        m_colourLimits.fill({m_lo, m_hi});
    }
    m_lutDirty = true;
    update();
    emit displayChanged();
}

void ImageView::setStretch(Stretch s) {
    m_stretch = s;
    update();
    emit displayChanged();
}

void ImageView::setLimitMode(LimitMode mode, double lowPercent, double highPercent) {
    m_limitMode = mode;
    m_lowPercent = lowPercent;
    m_highPercent = highPercent;
    recomputeLimits();
}

void ImageView::setManualLimits(double lo, double hi) {
    m_limitMode = LimitMode::Manual;
    LimitRequest req;
    req.mode = LimitMode::Manual;
    req.manualLow = lo;
    req.manualHigh = hi;
    std::tie(m_lo, m_hi) = computeLimits({}, req);
    recomputeLimits();
}

std::pair<double, double> ImageView::limits() const {
    return {m_lo, m_hi};
}

void ImageView::setColormap(Colormap c) {
    m_colormap = c;
    update();
    emit displayChanged();
}

void ImageView::setStretchParameters(float asinhSoftening, float logExponent) {
    if (asinhSoftening > 0) m_asinhSoftening = asinhSoftening;
    if (logExponent > 0) m_logExponent = logExponent;
    update();
}

void ImageView::rebuildSourceLayers() {
    m_sourceInst = buildSourceEllipses(m_markers, m_style);
    m_apertureInst =
        buildApertureCircles(m_markers, m_apertureRadii, m_annulusInner, m_annulusOuter, m_style);
    m_ellipseDirty[0] = m_ellipseDirty[1] = true;
    rebuildSelected();
}

void ImageView::rebuildSelected() {
    m_selectedInst.clear();
    if (m_selected >= 0 && m_selected < static_cast<int>(m_sourceInst.size())) {
        EllipseInstance e = m_sourceInst[static_cast<std::size_t>(m_selected)];
        e.rgba = m_style.selectedColour;
        m_selectedInst.push_back(e);
    }
    m_ellipseDirty[4] = true;
    update();
}

void ImageView::setSources(std::vector<Marker> markers) {
    m_markers = std::move(markers);
    if (m_selected >= static_cast<int>(m_markers.size())) m_selected = -1;
    rebuildSourceLayers();
}

void ImageView::setSourceScale(float scale) {
    if (!(scale > 0)) return;
    m_style.sourceScale = scale;
    rebuildSourceLayers();
}

void ImageView::setApertures(std::vector<float> radii, float annulusInner, float annulusOuter) {
    m_apertureRadii = std::move(radii);
    m_annulusInner = annulusInner;
    m_annulusOuter = annulusOuter;
    m_apertureInst =
        buildApertureCircles(m_markers, m_apertureRadii, m_annulusInner, m_annulusOuter, m_style);
    m_ellipseDirty[1] = true;
    update();
}

void ImageView::setPsfWhiskers(std::vector<Vector2> whiskers) {
    m_whiskers = std::move(whiskers);
    m_whiskerInst = buildWhiskers(m_whiskers, m_style);
    m_segmentDirty[0] = true;
    update();
}

void ImageView::setWhiskerScale(float scale) {
    if (!(scale > 0)) return;
    m_style.whiskerScale = scale;
    setPsfWhiskers(std::move(m_whiskers));
}

void ImageView::setReferenceStars(std::vector<Vector2> positions) {
    m_referenceInst = buildReferenceCircles(positions, m_style);
    m_ellipseDirty[2] = true;
    update();
}

void ImageView::setSeriesMarkers(std::vector<EllipseInstance> circles) {
    m_seriesInst = std::move(circles);
    m_ellipseDirty[3] = true;
    update();
}

void ImageView::setResidualVectors(std::vector<Vector2> v, float exaggeration) {
    m_residuals = std::move(v);
    m_exaggeration = exaggeration;
    m_residualInst = buildResidualArrows(m_residuals, m_exaggeration, m_style);
    m_segmentDirty[1] = true;
    update();
}

void ImageView::setSegmentation(std::shared_ptr<const Image<std::int32_t>> seg) {
    m_seg = std::move(seg);
    m_segDirty = true;
    update();
}

void ImageView::setLayerVisible(Layer layer, bool visible) {
    m_visible[static_cast<std::size_t>(layer)] = visible;
    update();
}

bool ImageView::layerVisible(Layer layer) const {
    return m_visible[static_cast<std::size_t>(layer)];
}

void ImageView::setSelectedSource(int index) {
    m_selected = (index >= 0 && index < static_cast<int>(m_markers.size())) ? index : -1;
    rebuildSelected();
}

void ImageView::setOverviewVisible(bool visible) {
    m_overview = visible;
    update();
}

int ImageView::pixelUploadCount() const {
    return m_renderer->pixelUploads();
}

// ---- view -------------------------------------------------------------------------------------------

ViewTransform ImageView::viewTransform() const {
    return {m_cx,
            m_cy,
            m_zoom,
            static_cast<double>(std::max(1, width())),
            static_cast<double>(std::max(1, height())),
            m_orientation};
}

void ImageView::clampZoom() {
    double minZoom = 1e-3;
    if (m_image && !m_image->empty()) minZoom = std::min(1.0, fitZoom() / 4.0);
    m_zoom = std::clamp(m_zoom, minZoom, kMaxZoom);
}

void ImageView::zoomToFit() {
    if (!m_image || m_image->empty()) return;
    m_zoom = fitZoom();
    m_cx = 0.5 * (m_image->width() - 1);
    m_cy = 0.5 * (m_image->height() - 1);
    m_fitPending = true; // stays fitted through resizes until the user zooms or pans
    emit viewChanged();
    update();
}

void ImageView::zoomOneToOne() {
    setZoom(1.0);
}

void ImageView::setZoom(double zoom) {
    zoomAbout(QPointF(0.5 * width(), 0.5 * height()), zoom);
}

void ImageView::zoomAbout(QPointF widgetPos, double newZoom) {
    if (!(newZoom > 0)) return;
    const QPointF before = widgetToImage(widgetPos);
    m_zoom = newZoom;
    clampZoom();
    // Keep the image point under widgetPos fixed.
    const auto d =
        viewTransform().widgetDeltaToImage(widgetPos.x() - 0.5 * width(), widgetPos.y() - 0.5 * height());
    m_cx = before.x() - d[0];
    m_cy = before.y() - d[1];
    m_fitPending = false;
    emit viewChanged();
    update();
}

void ImageView::centerOn(double x, double y) {
    if (!std::isfinite(x) || !std::isfinite(y)) return;
    m_cx = x;
    m_cy = y;
    m_fitPending = false;
    emit viewChanged();
    update();
}

double ImageView::zoom() const {
    return m_zoom;
}
QPointF ImageView::center() const {
    return {m_cx, m_cy};
}

QPointF ImageView::imageToWidget(QPointF p) const {
    const auto w = viewTransform().imageToWidget(p.x(), p.y());
    return {w[0], w[1]};
}

QPointF ImageView::widgetToImage(QPointF p) const {
    const auto i = viewTransform().widgetToImage(p.x(), p.y());
    return {i[0], i[1]};
}

// ---- DS9's habits: cursor, crosshair, magnifier, orientation ----------------------------------------

double ImageView::fitZoom() const {
    const bool swap = m_orientation.swapsAxes();
    return ViewTransform::fitZoom(swap ? m_image->height() : m_image->width(),
                                  swap ? m_image->width() : m_image->height(), std::max(1, width()),
                                  std::max(1, height()));
}

void ImageView::setCursorPosition(double x, double y) {
    emitCursorAt({x, y});
}

void ImageView::setCrosshair(bool on) {
    m_crosshair = on;
    update();
}

void ImageView::setMagnifier(bool on) {
    m_magnifier = on;
    update();
}

QRect ImageView::magnifierRect() const {
    if (!m_magnifier || !std::isfinite(m_cursor.x()) || !std::isfinite(m_cursor.y())) return {};
    // Below and right of the cursor, on the other side where that leaves the view, then clamped into it.
    const int side = std::min({kMagnifierSidePx, width(), height()});
    const int gap = 16;
    const QPointF w = imageToWidget(m_cursor);
    int left = static_cast<int>(w.x()) + gap, top = static_cast<int>(w.y()) + gap;
    if (left + side > width()) left = static_cast<int>(w.x()) - gap - side;
    if (top + side > height()) top = static_cast<int>(w.y()) - gap - side;
    left = std::clamp(left, 0, width() - side);
    top = std::clamp(top, 0, height() - side);
    return {left, top, side, side};
}

void ImageView::fillToolOptions(RenderOptions& o, double dpr) const {
    if (m_crosshair) {
        o.crosshairX = m_cursor.x();
        o.crosshairY = m_cursor.y();
    }
    const QRect r = magnifierRect();
    if (r.isEmpty()) return;
    o.magnifier.x = m_cursor.x();
    o.magnifier.y = m_cursor.y();
    o.magnifier.zoom = kMagnifierZoom * dpr;
    o.magnifier.left = static_cast<int>(std::round(r.left() * dpr));
    o.magnifier.top = static_cast<int>(std::round(r.top() * dpr));
    o.magnifier.side = static_cast<int>(std::round(r.width() * dpr));
}

void ImageView::setOrientation(Orientation orientation) {
    orientation.quarterTurns = orientation.turns();
    m_orientation = orientation;
    if (m_fitPending && m_image) zoomToFit(); // a turned frame fits differently
    emit viewChanged();
    update();
}

void ImageView::toggleFlipX() {
    Orientation o = m_orientation;
    o.flipX = !o.flipX;
    setOrientation(o);
}

void ImageView::toggleFlipY() {
    Orientation o = m_orientation;
    o.flipY = !o.flipY;
    setOrientation(o);
}

void ImageView::rotate90() {
    Orientation o = m_orientation;
    o.quarterTurns = o.turns() + 1;
    setOrientation(o);
}

void ImageView::moveCursorBy(double screenDx, double screenDy) {
    if (!m_image || m_image->empty()) return;
    QPointF c = m_cursor;
    if (!std::isfinite(c.x()) || !std::isfinite(c.y())) c = center();
    // screen right/up to image axes: one image pixel per step whatever the zoom and orientation
    const auto d = m_orientation.invert(screenDx, screenDy);
    const double x = std::clamp(std::round(c.x()) + std::round(d[0]), 0.0, m_image->width() - 1.0);
    const double y = std::clamp(std::round(c.y()) + std::round(d[1]), 0.0, m_image->height() - 1.0);
    emitCursorAt({x, y});
}

void ImageView::panBy(double widgetDx, double widgetDy) {
    const auto d = viewTransform().widgetDeltaToImage(widgetDx, widgetDy);
    m_cx += d[0];
    m_cy += d[1];
    m_fitPending = false;
    emit viewChanged();
    update();
}

bool ImageView::arrowKey(QKeyEvent* e) {
    int dx = 0, dy = 0; // screen: right, up
    switch (e->key()) {
    case Qt::Key_Left:
        dx = -1;
        break;
    case Qt::Key_Right:
        dx = 1;
        break;
    case Qt::Key_Up:
        dy = 1;
        break;
    case Qt::Key_Down:
        dy = -1;
        break;
    default:
        return false;
    }
    if (e->modifiers() & Qt::ControlModifier) { // pan by an eighth of the view
        const double step = 0.125 * std::min(width(), height());
        panBy(dx * step, -dy * step);
        return true;
    }
    const int step = (e->modifiers() & Qt::ShiftModifier) ? 10 : 1;
    moveCursorBy(dx * step, dy * step);
    return true;
}

// ---- GL ---------------------------------------------------------------------------------------------

void ImageView::initializeGL() {
    try {
        m_renderer->initialize();
    } catch (const std::exception& e) {
        m_glFailure = QString::fromStdString(e.what());
        qWarning("ImageView: %s", e.what());
        return;
    }
    QObject::disconnect(m_contextConnection);
    m_contextConnection = connect(context(), &QOpenGLContext::aboutToBeDestroyed, this, [this] {
        if (!m_renderer || !m_renderer->initialized()) return;
        makeCurrent();
        m_renderer->destroy();
        doneCurrent();
    });
    // A new context (reparenting) needs every GPU-side object again.
    m_imageDirty = static_cast<bool>(m_image);
    m_lodDirty = !m_lod.empty();
    m_segDirty = static_cast<bool>(m_seg);
    m_lutDirty = true;
    m_ellipseDirty.fill(true);
    m_segmentDirty.fill(true);
}

void ImageView::resizeGL(int, int) {
    if (m_fitPending && m_image)
        zoomToFit();
    else
        clampZoom();
}

void ImageView::syncRenderer() {
    ImageRenderer& r = *m_renderer;
    if (m_imageDirty) {
        if (m_image)
            r.uploadImage(m_image->view());
        else
            r.clearImage();
        m_imageDirty = false;
        m_segDirty = true;
        m_colourDirty = true; // uploadImage dropped the tiles' planes
        m_lodDirty = !m_lod.empty(); // uploadImage dropped the levels
    }
    if (m_lodDirty) {
        r.clearLod();
        for (const LodLevel& l : m_lod)
            r.uploadLodLevel(l.factor, l.image->view());
        m_lodDirty = false;
    }
    const bool colourWanted = m_colourShown && m_colour[0];
    if (m_colourDirty && (colourWanted || !m_colour[0])) { // (as the map below: uploaded when shown)
        if (m_colour[0] && m_image)
            r.uploadColourPlanes(m_colour[0]->view(), m_colour[1]->view(), m_colour[2]->view());
        else
            r.clearColourPlanes();
        m_colourDirty = false;
    }
    // A map comes with every result (16 MB at 2048²): uploaded when the layer is shown, not while hidden.
    const bool segShown = m_visible[static_cast<std::size_t>(Layer::Segmentation)];
    if (m_segDirty && (segShown || !m_seg)) {
        if (m_seg && m_image)
            r.uploadSegmentation(m_seg->view());
        else
            r.clearSegmentation();
        m_segDirty = false;
    }
    if (m_lutDirty && m_stretch == Stretch::HistEq) {
        r.setHistEqLut(histEqLut(m_sample, m_lo, m_hi));
        m_lutDirty = false;
    }
    DisplaySettings d;
    d.stretch.stretch = m_stretch;
    d.stretch.lo = m_lo;
    d.stretch.hi = m_hi;
    d.stretch.asinhSoftening = m_asinhSoftening;
    d.stretch.logExponent = m_logExponent;
    d.colormap = m_colormap;
    d.colour = colourWanted;
    for (std::size_t k = 0; k < 3; ++k) {
        d.colourLo[k] = static_cast<float>(m_colourLimits[k].first);
        d.colourHi[k] = static_cast<float>(m_colourLimits[k].second);
    }
    r.setDisplay(d);
    const std::vector<EllipseInstance>* ell[5] = {&m_sourceInst, &m_apertureInst, &m_referenceInst,
                                                  &m_seriesInst, &m_selectedInst};
    for (int i = 0; i < 5; ++i)
        if (m_ellipseDirty[static_cast<std::size_t>(i)]) {
            r.setEllipses(static_cast<EllipseLayer>(i), *ell[i]);
            m_ellipseDirty[static_cast<std::size_t>(i)] = false;
        }
    const std::vector<SegmentInstance>* seg[2] = {&m_whiskerInst, &m_residualInst};
    for (int i = 0; i < 2; ++i)
        if (m_segmentDirty[static_cast<std::size_t>(i)]) {
            r.setSegments(static_cast<SegmentLayer>(i), *seg[i]);
            m_segmentDirty[static_cast<std::size_t>(i)] = false;
        }
}

void ImageView::paintGL() {
    if (!m_renderer->initialized()) return;
    syncRenderer();
    const double dpr = devicePixelRatioF();
    ViewTransform v = viewTransform();
    v.zoom *= dpr;
    v.width = std::round(v.width * dpr);
    v.height = std::round(v.height * dpr);
    RenderOptions o;
    o.devicePixelRatio = dpr;
    o.ellipses = {m_visible[0], m_visible[1], m_visible[3], m_visible[6], m_visible[0]};
    o.segments = {m_visible[2], m_visible[4]};
    o.segmentation = m_visible[5];
    o.overview = m_overview;
    fillToolOptions(o, dpr);
    m_renderer->render(v, o);
#ifndef NDEBUG
    for (const std::string& e : m_renderer->takeGlErrors())
        qWarning("ImageView: %s", e.c_str());
#endif
}

// ---- input ------------------------------------------------------------------------------------------

bool ImageView::overviewContains(QPointF p) const {
    if (!m_overview || !m_image) return false;
    const double dpr = devicePixelRatioF();
    ViewTransform v = viewTransform();
    v.width *= dpr;
    v.height *= dpr;
    RenderOptions o;
    o.devicePixelRatio = dpr;
    const auto r = m_renderer->overviewRect(v, o);
    if (r[2] <= 0) return false;
    const double x = p.x() * dpr, y = p.y() * dpr;
    return x >= r[0] && x < r[0] + r[2] && y >= r[1] && y < r[1] + r[3];
}

void ImageView::centerFromOverview(QPointF p) {
    const double dpr = devicePixelRatioF();
    ViewTransform v = viewTransform();
    v.width *= dpr;
    v.height *= dpr;
    RenderOptions o;
    o.devicePixelRatio = dpr;
    const auto r = m_renderer->overviewRect(v, o);
    if (r[2] <= 0) return;
    const ViewTransform ov = m_renderer->overviewTransform(v, o);
    const auto img = ov.widgetToImage(p.x() * dpr - r[0], p.y() * dpr - r[1]);
    centerOn(std::clamp(img[0], -0.5, m_image->width() - 0.5),
             std::clamp(img[1], -0.5, m_image->height() - 0.5));
}

int ImageView::pickSource(QPointF p) const {
    const QPointF img = widgetToImage(p);
    int best = -1;
    double bestD2 = std::numeric_limits<double>::infinity();
    for (std::size_t i = 0; i < m_markers.size(); ++i) {
        const Marker& m = m_markers[i];
        const double dx = (m.x - img.x()) * m_zoom, dy = (m.y - img.y()) * m_zoom;
        const double d2 = dx * dx + dy * dy;
        if (d2 >= bestD2) continue;
        const double b = std::isfinite(m.b) ? m.b : 0.0;
        const double r = std::max(kPickRadiusPx, std::min(30.0, m_style.sourceScale * b * m_zoom));
        if (d2 <= r * r) {
            best = static_cast<int>(i);
            bestD2 = d2;
        }
    }
    return best;
}

void ImageView::emitCursor(QPointF p) {
    const double nan = std::numeric_limits<double>::quiet_NaN();
    emitCursorAt(overviewContains(p) ? QPointF(nan, nan) : widgetToImage(p));
}

bool ImageView::insideImage(QPointF img) const {
    return m_image && img.x() >= -0.5 && img.y() >= -0.5 && img.x() < m_image->width() - 0.5 &&
           img.y() < m_image->height() - 0.5;
}

void ImageView::emitCursorAt(QPointF img) {
    const double nan = std::numeric_limits<double>::quiet_NaN();
    m_cursor = insideImage(img) ? img : QPointF(nan, nan);
    if (m_crosshair || m_magnifier) update();
    emit cursorMoved(m_cursor.x(), m_cursor.y());
}

void ImageView::mousePressEvent(QMouseEvent* e) {
    if (e->button() != Qt::LeftButton) return QOpenGLWidget::mousePressEvent(e);
    m_pressPos = m_lastMouse = e->position();
    if (overviewContains(e->position())) {
        m_draggingOverview = true;
        centerFromOverview(e->position());
    } else {
        m_dragging = true;
    }
}

void ImageView::mouseMoveEvent(QMouseEvent* e) {
    const QPointF p = e->position();
    if (m_draggingOverview) {
        centerFromOverview(p);
    } else if (m_dragging) {
        const QPointF d = p - m_lastMouse;
        if (d.manhattanLength() > 0) panBy(-d.x(), -d.y());
    }
    m_lastMouse = p;
    if (!m_crosshair) emitCursor(p);
}

void ImageView::mouseReleaseEvent(QMouseEvent* e) {
    if (e->button() != Qt::LeftButton) return QOpenGLWidget::mouseReleaseEvent(e);
    const bool click = m_dragging && (e->position() - m_pressPos).manhattanLength() < 4;
    m_dragging = m_draggingOverview = false;
    if (click) {
        if (m_crosshair) emitCursorAt(widgetToImage(e->position()));
        const int idx = pickSource(e->position());
        if (idx >= 0) emit sourceClicked(idx);
    }
}

void ImageView::wheelEvent(QWheelEvent* e) {
    const double steps = e->angleDelta().y() / 120.0;
    if (steps != 0) zoomAbout(e->position(), m_zoom * std::pow(1.25, steps));
    e->accept();
}

void ImageView::keyPressEvent(QKeyEvent* e) {
    switch (e->key()) {
    case Qt::Key_Plus:
    case Qt::Key_Equal:
        setZoom(m_zoom * 1.25);
        break;
    case Qt::Key_Minus:
        setZoom(m_zoom / 1.25);
        break;
    case Qt::Key_0:
        zoomToFit();
        break;
    case Qt::Key_1:
        zoomOneToOne();
        break;
    default:
        if (arrowKey(e)) break;
        QOpenGLWidget::keyPressEvent(e);
        return;
    }
    e->accept();
}

void ImageView::leaveEvent(QEvent* e) {
    const double nan = std::numeric_limits<double>::quiet_NaN();
    if (!m_crosshair) emitCursorAt({nan, nan}); // the crosshair stays where it was put
    QOpenGLWidget::leaveEvent(e);
}

} // namespace gpuphot::viewers
