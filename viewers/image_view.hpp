#pragma once
// The workbench image viewer: a thin QOpenGLWidget that owns an ImageRenderer (viewers/image_renderer.hpp)
// and turns mouse/keyboard input into view changes. Pixels are uploaded once as float textures; stretch,
// limits and colormap are shader uniforms, so changing them never re-uploads pixels. Coordinates are
// 0-based image pixels with pixel centres at integers (what a user sees is 1-based: ui/ adds 1).
#include <QOpenGLWidget>
#include <QPointF>
#include <QRect>

#include <array>
#include <cstdint>
#include <limits>
#include <memory>
#include <utility>
#include <vector>

#include "core/model/image.hpp"
#include "viewers/image_lod.hpp"
#include "viewers/overlay_geometry.hpp"
#include "viewers/stretch.hpp"
#include "viewers/view_transform.hpp"

namespace gpuphot::viewers {

// Stretch, LimitMode, Colormap (viewers/stretch.hpp) and Marker, Vector2 (viewers/overlay_geometry.hpp) are
// part of this API.
enum class Layer {
    Sources,
    Apertures,
    PsfWhiskers,
    ReferenceStars,
    AstrometricResiduals,
    Segmentation,
    SeriesStars
};

class ImageRenderer;
struct RenderOptions;

class ImageView : public QOpenGLWidget {
    Q_OBJECT
public:
    explicit ImageView(QWidget* parent = nullptr);
    ~ImageView() override;

    void
    setImage(std::shared_ptr<const Image<float>> image); // uploads once (tiled above GL_MAX_TEXTURE_SIZE)
    // Level of detail for far zoomed-out views (viewers/image_lod.hpp): for an image of at least this many
    // pixels (default 16 M) setImage also builds reduced levels on Qt's global thread pool; they are
    // uploaded when ready (lodReady) and drawn instead of the full-resolution texture where the zoom allows.
    void setLodMinPixels(std::int64_t pixels);
    int lodLevels() const { return static_cast<int>(m_lod.size()); } // levels built for the current image
    std::shared_ptr<const Image<float>> image() const { return m_image; }
    // A colour composite of the image (the red, green and blue planes of a colour-filter frame's 2x2
    // super-pixels, of the image's size; null: none). Drawn instead of the image while shown, each plane
    // stretched with its own limits from the limit mode (manual limits apply to all three); setImage drops it.
    void setColourPlanes(std::shared_ptr<const Image<float>> red, std::shared_ptr<const Image<float>> green,
                         std::shared_ptr<const Image<float>> blue);
    bool hasColourPlanes() const { return static_cast<bool>(m_colour[0]); }
    void setColourShown(bool shown);
    bool colourShown() const { return m_colourShown; }
    std::array<std::pair<double, double>, 3> colourLimits() const { return m_colourLimits; }

    void setStretch(Stretch stretch);
    Stretch stretch() const { return m_stretch; }
    void setLimitMode(LimitMode mode, double lowPercent = 0.25, double highPercent = 99.75);
    LimitMode limitMode() const { return m_limitMode; }
    void setManualLimits(double lo, double hi);
    std::pair<double, double> limits() const;
    void setColormap(Colormap colormap);
    Colormap colormap() const { return m_colormap; }
    // Softening of the asinh stretch as a fraction of the [lo, hi] range (default 0.1) and the log
    // stretch exponent a in log(1 + a t) / log(1 + a) (default 1000).
    void setStretchParameters(float asinhSoftening, float logExponent);

    void setSources(std::vector<Marker> markers); // ellipses (kron-like scale factor settable)
    void setSourceScale(float scale);             // ellipse semi-axes drawn as scale * (a, b); default 3
    void setApertures(std::vector<float> radii, float annulusInner,
                      float annulusOuter); // drawn around sources
    void setPsfWhiskers(std::vector<Vector2> whiskers);
    void setWhiskerScale(float scale);                      // whisker length multiplier (default 1)
    void setReferenceStars(std::vector<Vector2> positions); // dx,dy ignored (circles)
    // A light curve's target and comparison stars: circles of their own colour (radius in image px).
    void setSeriesMarkers(std::vector<EllipseInstance> circles);
    void setResidualVectors(std::vector<Vector2> v, float exaggeration);
    void setSegmentation(std::shared_ptr<const Image<std::int32_t>> seg); // translucent colour layer
    void setLayerVisible(Layer layer, bool visible);
    bool layerVisible(Layer layer) const;
    void setSelectedSource(int index); // -1: none; highlighted marker
    int selectedSource() const { return m_selected; }
    void setOverviewVisible(bool visible); // the panner inset in the lower-right corner
    bool overviewVisible() const { return m_overview; }

    void zoomToFit();
    void zoomOneToOne();
    void centerOn(double x, double y);
    void setZoom(double zoom); // screen px per image px, about the widget centre
    double zoom() const;
    QPointF center() const; // image coordinate at the widget centre
    QPointF imageToWidget(QPointF p) const;
    QPointF widgetToImage(QPointF p) const;

    // DS9's viewing habits (README.md, Workbench).
    // The cursor: the image position the readout shows (cursorMoved). The mouse sets it; the arrow keys
    // move it by one image pixel (Shift: ten) on screen from the pixel centre nearest to it (from the
    // view centre when there is none); Ctrl+arrows pan. NaN when none.
    void setCursorPosition(double x, double y);
    QPointF cursorPosition() const { return m_cursor; }
    // Crosshair mode: lines across the view through the cursor; the mouse no longer moves the cursor,
    // a click does (and still selects the source under it).
    void setCrosshair(bool on);
    bool crosshair() const { return m_crosshair; }
    // The magnifier: kMagnifierZoom screen px per image px of the pixels around the cursor, in a square
    // of kMagnifierSidePx beside the cursor, kept inside the view.
    static constexpr double kMagnifierZoom = 8.0;
    static constexpr int kMagnifierSidePx = 128;
    void setMagnifier(bool on);
    bool magnifier() const { return m_magnifier; }
    QRect magnifierRect() const; // logical widget px; empty when it is not drawn
    // Flips and quarter turns of the view (viewers/view_transform.hpp); overlays, clicks and the cursor
    // follow. The image point at the view centre stays there.
    void setOrientation(Orientation orientation);
    Orientation orientation() const { return m_orientation; }
    void toggleFlipX();
    void toggleFlipY();
    void rotate90(); // a quarter turn counter-clockwise

    // Diagnostics (tests, benchmarks): number of pixel texture uploads (tiles) since construction,
    // and the renderer (nullptr before the GL context exists).
    int pixelUploadCount() const;
    ImageRenderer* renderer() const { return m_renderer.get(); }
    // Non-empty when the GL context or the shaders failed (the view then stays blank).
    QString glFailure() const { return m_glFailure; }
    ViewTransform viewTransform() const; // logical widget pixels

signals:
    void cursorMoved(double x, double y); // 0-based image px (NaN when outside)
    void sourceClicked(int index);        // nearest marker within a few screen px
    void viewChanged();
    void displayChanged(); // stretch, limits or colormap changed (the colorbar follows)
    void lodReady();       // the reduced levels of the current image exist (drawn from the next frame on)

protected:
    void initializeGL() override;
    void resizeGL(int w, int h) override;
    void paintGL() override;
    void mousePressEvent(QMouseEvent* e) override;
    void mouseMoveEvent(QMouseEvent* e) override;
    void mouseReleaseEvent(QMouseEvent* e) override;
    void wheelEvent(QWheelEvent* e) override;
    void keyPressEvent(QKeyEvent* e) override;
    void leaveEvent(QEvent* e) override;

private:
    void recomputeLimits();
    void rebuildSourceLayers();
    void rebuildSelected();
    void syncRenderer();
    void emitCursor(QPointF widgetPos);
    void zoomAbout(QPointF widgetPos, double newZoom);
    void clampZoom();
    int pickSource(QPointF widgetPos) const;
    bool overviewContains(QPointF widgetPos) const;
    void centerFromOverview(QPointF widgetPos);
    bool insideImage(QPointF imagePos) const;
    double fitZoom() const; // the whole image in the view, as the orientation turns it
    void emitCursorAt(QPointF imagePos);
    void moveCursorBy(double screenDx, double screenDy);
    void panBy(double widgetDx, double widgetDy);
    bool arrowKey(QKeyEvent* e);
    void fillToolOptions(RenderOptions& o, double dpr) const;

    std::unique_ptr<ImageRenderer> m_renderer;
    std::shared_ptr<const Image<float>> m_image;
    std::shared_ptr<const Image<std::int32_t>> m_seg;
    std::array<std::shared_ptr<const Image<float>>, 3> m_colour; // red, green, blue planes (or none)
    std::array<std::vector<float>, 3> m_colourSample;
    std::array<std::pair<double, double>, 3> m_colourLimits{};
    bool m_colourShown = false, m_colourDirty = false;
    std::vector<Marker> m_markers;
    std::vector<float> m_sample; // deterministic pixel sample for limits and the histogram-equalisation LUT
    std::vector<LodLevel> m_lod; // reduced levels of m_image (empty until built)
    std::shared_ptr<int>
        m_lodToken; // a build's result is taken only while its token lives (same image, view alive)
    std::int64_t m_lodMinPixels = 16'000'000;
    bool m_lodDirty = false;
    OverlayStyle m_style;
    std::vector<float> m_apertureRadii;
    float m_annulusInner = 0, m_annulusOuter = 0;
    std::vector<Vector2> m_whiskers, m_residuals;
    float m_exaggeration = 1;
    std::vector<EllipseInstance> m_sourceInst, m_apertureInst, m_referenceInst, m_seriesInst, m_selectedInst;
    std::vector<SegmentInstance> m_whiskerInst, m_residualInst;
    std::array<bool, 7> m_visible{true, true, true, true, true, true, true};
    bool m_overview = true;
    float m_asinhSoftening = 0.1f, m_logExponent = 1000.f;
    // What paintGL must push to the renderer.
    bool m_imageDirty = false, m_segDirty = false, m_lutDirty = true;
    std::array<bool, 5> m_ellipseDirty{};
    std::array<bool, 2> m_segmentDirty{};
    QString m_glFailure;
    QMetaObject::Connection m_contextConnection;
    Stretch m_stretch = Stretch::Linear;
    LimitMode m_limitMode = LimitMode::ZScale;
    Colormap m_colormap = Colormap::Grey;
    double m_lowPercent = 0.25, m_highPercent = 99.75;
    double m_lo = 0.0, m_hi = 1.0;
    int m_selected = -1;
    bool m_fitPending = true;
    double m_zoom = 1.0;
    double m_cx = 0.0, m_cy = 0.0; // image coordinate at the widget centre
    Orientation m_orientation;
    QPointF m_cursor{std::numeric_limits<double>::quiet_NaN(), std::numeric_limits<double>::quiet_NaN()};
    bool m_crosshair = false;
    bool m_magnifier = false;
    bool m_dragging = false;
    bool m_draggingOverview = false;
    QPointF m_lastMouse;
    QPointF m_pressPos;
};

} // namespace gpuphot::viewers
