#include "viewers/image_renderer.hpp"

#include <QElapsedTimer>
#include <QFile>
#include <QOpenGLContext>
#include <QOpenGLShaderProgram>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <stdexcept>

static void gpuphotInitShaderResources() {
    Q_INIT_RESOURCE(shaders);
}

namespace gpuphot::viewers {

namespace {

QByteArray readShader(const char* name, bool es) {
    QFile f(QStringLiteral(":/shaders/") + QString::fromLatin1(name));
    if (!f.open(QIODevice::ReadOnly))
        throw std::runtime_error(std::string("viewers: shader resource :/shaders/") + name + " missing");
    const QByteArray header =
        es ? QByteArray("#version 300 es\nprecision highp float;\nprecision highp int;\n"
                        "precision highp sampler2D;\nprecision highp isampler2D;\n")
           : QByteArray("#version 330 core\n");
    return header + f.readAll();
}

std::unique_ptr<QOpenGLShaderProgram> buildProgram(const char* vert, const char* frag, bool es) {
    auto prog = std::make_unique<QOpenGLShaderProgram>();
    if (!prog->addShaderFromSourceCode(QOpenGLShader::Vertex, readShader(vert, es)) ||
        !prog->addShaderFromSourceCode(QOpenGLShader::Fragment, readShader(frag, es)) || !prog->link())
        throw std::runtime_error(std::string("viewers: shader ") + vert + "/" + frag +
                                 " failed: " + prog->log().toStdString());
    return prog;
}

// Image to clip space of every vertex shader: (orient(p - u_center)) * u_scale.
void setViewUniforms(QOpenGLShaderProgram& p, const ViewTransform& view) {
    p.setUniformValue("u_center", static_cast<float>(view.cx), static_cast<float>(view.cy));
    p.setUniformValue("u_scale", static_cast<float>(2 * view.zoom / view.width),
                      static_cast<float>(2 * view.zoom / view.height));
    const auto m = view.orientation.matrix();
    p.setUniformValue("u_orient", m[0], m[1], m[2], m[3]);
}

constexpr int kEllipseStride = sizeof(EllipseInstance);
constexpr int kSegmentStride = sizeof(SegmentInstance);

} // namespace

ImageRenderer::ImageRenderer() {
    gpuphotInitShaderResources();
}

ImageRenderer::~ImageRenderer() {
    // GL objects must be freed by destroy() with the context current; a renderer destroyed without it
    // leaks them into a context that is going away anyway.
}

void ImageRenderer::checkGl(const char* where) {
    for (int i = 0; i < 16; ++i) {
        const GLenum e = glGetError();
        if (e == GL_NO_ERROR) return;
        char buf[96];
        std::snprintf(buf, sizeof buf, "%s: GL error 0x%04x", where, static_cast<unsigned>(e));
        m_glErrors.emplace_back(buf);
    }
}

std::vector<std::string> ImageRenderer::takeGlErrors() {
    std::vector<std::string> out;
    out.swap(m_glErrors);
    return out;
}

void ImageRenderer::initialize() {
    if (m_initialized) return;
    initializeOpenGLFunctions();
    m_es = QOpenGLContext::currentContext()->isOpenGLES();
    glGetIntegerv(GL_MAX_TEXTURE_SIZE, &m_maxTexture);
    m_imageProg = buildProgram("image.vert.glsl", "image.frag.glsl", m_es);
    m_ellipseProg = buildProgram("ellipse.vert.glsl", "overlay.frag.glsl", m_es);
    m_segmentProg = buildProgram("segment.vert.glsl", "overlay.frag.glsl", m_es);

    const float quad[8] = {0, 0, 1, 0, 0, 1, 1, 1};
    glGenVertexArrays(1, &m_quadVao);
    glGenBuffers(1, &m_quadVbo);
    glBindVertexArray(m_quadVao);
    glBindBuffer(GL_ARRAY_BUFFER, m_quadVbo);
    glBufferData(GL_ARRAY_BUFFER, sizeof quad, quad, GL_STATIC_DRAW);
    glEnableVertexAttribArray(0);
    glVertexAttribPointer(0, 2, GL_FLOAT, GL_FALSE, 2 * sizeof(float), nullptr);
    glBindVertexArray(0);

    makeNearestTexture(m_dummySeg);
    const std::int32_t zero = 0;
    glTexImage2D(GL_TEXTURE_2D, 0, GL_R32I, 1, 1, 0, GL_RED_INTEGER, GL_INT, &zero);
    makeNearestTexture(m_lutTex);
    const float ident[2] = {0.f, 1.f};
    glPixelStorei(GL_UNPACK_ALIGNMENT, 4);
    glTexImage2D(GL_TEXTURE_2D, 0, GL_R32F, 2, 1, 0, GL_RED, GL_FLOAT, ident);
    m_lutSize = 2;
    makeNearestTexture(m_cmapTex);
    glBindTexture(GL_TEXTURE_2D, 0);
    m_initialized = true;
    uploadColormap();
    checkGl("ImageRenderer::initialize");
}

void ImageRenderer::destroy() {
    if (!m_initialized) return;
    clearImage();
    auto delBuf = [this](InstanceBuffer& b) {
        if (b.vbo) glDeleteBuffers(1, &b.vbo);
        if (b.vao) glDeleteVertexArrays(1, &b.vao);
        b = {};
    };
    for (auto& b : m_ellipses)
        delBuf(b);
    for (auto& b : m_largeEllipses)
        delBuf(b);
    for (auto& b : m_segments)
        delBuf(b);
    delBuf(m_frameSegments);
    delBuf(m_crosshairSegments);
    delBuf(m_magnifierSegments);
    glDeleteBuffers(1, &m_quadVbo);
    glDeleteVertexArrays(1, &m_quadVao);
    const unsigned texs[3] = {m_lutTex, m_cmapTex, m_dummySeg};
    glDeleteTextures(3, texs);
    m_imageProg.reset();
    m_ellipseProg.reset();
    m_segmentProg.reset();
    m_initialized = false;
    m_cmapValid = false;
}

void ImageRenderer::clearImage() {
    clearSegmentation();
    clearColourPlanes();
    clearLod();
    for (Tile& t : m_tiles)
        if (t.tex) glDeleteTextures(1, &t.tex);
    m_tiles.clear();
    m_width = m_height = 0;
}

void ImageRenderer::clearLod() {
    for (LodTiles& l : m_lod)
        for (Tile& t : l.tiles)
            if (t.tex) glDeleteTextures(1, &t.tex);
    m_lod.clear();
}

void ImageRenderer::uploadLodLevel(int factor, const ImageViewT<float>& level) {
    if (m_width <= 0 || factor < 2 || level.empty() || level.width != (m_width + factor - 1) / factor ||
        level.height != (m_height + factor - 1) / factor)
        return; // not a level of the uploaded image
    for (LodTiles& l : m_lod)
        if (l.factor == factor) return;
    LodTiles l;
    l.factor = factor;
    l.width = level.width;
    l.height = level.height;
    uploadTiles(level, l.tiles);
    m_lod.push_back(std::move(l));
    std::sort(m_lod.begin(), m_lod.end(),
              [](const LodTiles& a, const LodTiles& b) { return a.factor < b.factor; });
    checkGl("ImageRenderer::uploadLodLevel");
}

void ImageRenderer::uploadImage(const ImageViewT<float>& image) {
    clearImage();
    if (image.empty()) return;
    m_width = image.width;
    m_height = image.height;
    uploadTiles(image, m_tiles);
    checkGl("ImageRenderer::uploadImage");
}

void ImageRenderer::uploadTiles(const ImageViewT<float>& image, std::vector<Tile>& tiles) {
    const int tile = std::max(1, m_tileLimit > 0 ? std::min(m_tileLimit, m_maxTexture) : m_maxTexture);
    const int width = image.width, height = image.height;
    glPixelStorei(GL_UNPACK_ALIGNMENT, 4);
    glPixelStorei(GL_UNPACK_ROW_LENGTH, static_cast<GLint>(image.stride));
    for (int y0 = 0; y0 < height; y0 += tile) {
        for (int x0 = 0; x0 < width; x0 += tile) {
            Tile t{x0, y0, std::min(tile, width - x0), std::min(tile, height - y0)};
            makeNearestTexture(t.tex);
            glTexImage2D(GL_TEXTURE_2D, 0, GL_R32F, t.w, t.h, 0, GL_RED, GL_FLOAT, &image(x0, y0));
            if (&tiles == &m_tiles) ++m_pixelUploads; // full-resolution tiles (levels are counted apart)
            tiles.push_back(t);
        }
    }
    glPixelStorei(GL_UNPACK_ROW_LENGTH, 0);
    glBindTexture(GL_TEXTURE_2D, 0);
}

// A new texture bound to GL_TEXTURE_2D: nearest sampling (pixels, not interpolated), clamped at the edges.
void ImageRenderer::makeNearestTexture(unsigned& tex) {
    glGenTextures(1, &tex);
    glBindTexture(GL_TEXTURE_2D, tex);
    glTexParameteri(GL_TEXTURE_2D, GL_TEXTURE_MIN_FILTER, GL_NEAREST);
    glTexParameteri(GL_TEXTURE_2D, GL_TEXTURE_MAG_FILTER, GL_NEAREST);
    glTexParameteri(GL_TEXTURE_2D, GL_TEXTURE_WRAP_S, GL_CLAMP_TO_EDGE);
    glTexParameteri(GL_TEXTURE_2D, GL_TEXTURE_WRAP_T, GL_CLAMP_TO_EDGE);
}

void ImageRenderer::deleteTileTextures(unsigned Tile::*which) {
    for (Tile& t : m_tiles)
        if (t.*which) {
            glDeleteTextures(1, &(t.*which));
            t.*which = 0;
        }
}

void ImageRenderer::clearSegmentation() {
    deleteTileTextures(&Tile::seg);
    m_hasSeg = false;
}

void ImageRenderer::uploadSegmentation(const ImageViewT<std::int32_t>& seg) {
    clearSegmentation();
    if (seg.empty() || seg.width != m_width || seg.height != m_height) return;
    glPixelStorei(GL_UNPACK_ALIGNMENT, 4);
    glPixelStorei(GL_UNPACK_ROW_LENGTH, static_cast<GLint>(seg.stride));
    for (Tile& t : m_tiles) {
        makeNearestTexture(t.seg);
        glTexImage2D(GL_TEXTURE_2D, 0, GL_R32I, t.w, t.h, 0, GL_RED_INTEGER, GL_INT, &seg(t.x0, t.y0));
        ++m_segUploads;
    }
    glPixelStorei(GL_UNPACK_ROW_LENGTH, 0);
    glBindTexture(GL_TEXTURE_2D, 0);
    m_hasSeg = true;
    checkGl("ImageRenderer::uploadSegmentation");
}

void ImageRenderer::clearColourPlanes() {
    deleteTileTextures(&Tile::rgb);
    m_hasRgb = false;
}

void ImageRenderer::uploadColourPlanes(const ImageViewT<float>& red, const ImageViewT<float>& green,
                                       const ImageViewT<float>& blue) {
    clearColourPlanes();
    for (const ImageViewT<float>* c : {&red, &green, &blue})
        if (c->empty() || c->width != m_width || c->height != m_height) return;
    std::vector<float> rgb;
    glPixelStorei(GL_UNPACK_ALIGNMENT, 4);
    for (Tile& t : m_tiles) {
        rgb.resize(static_cast<std::size_t>(t.w) * t.h * 3);
        for (int y = 0; y < t.h; ++y)
            for (int x = 0; x < t.w; ++x) {
                float* o = rgb.data() + (static_cast<std::size_t>(y) * t.w + x) * 3;
                o[0] = red(t.x0 + x, t.y0 + y);
                o[1] = green(t.x0 + x, t.y0 + y);
                o[2] = blue(t.x0 + x, t.y0 + y);
            }
        makeNearestTexture(t.rgb);
        glTexImage2D(GL_TEXTURE_2D, 0, GL_RGB32F, t.w, t.h, 0, GL_RGB, GL_FLOAT, rgb.data());
    }
    glBindTexture(GL_TEXTURE_2D, 0);
    m_hasRgb = true;
    checkGl("ImageRenderer::uploadColourPlanes");
}

void ImageRenderer::uploadColormap() {
    const auto table = colormapTable(m_display.colormap);
    glBindTexture(GL_TEXTURE_2D, m_cmapTex);
    glPixelStorei(GL_UNPACK_ALIGNMENT, 4);
    glTexImage2D(GL_TEXTURE_2D, 0, GL_RGBA8, 256, 1, 0, GL_RGBA, GL_UNSIGNED_BYTE, table.data());
    glBindTexture(GL_TEXTURE_2D, 0);
    m_uploadedCmap = m_display.colormap;
    m_cmapValid = true;
    ++m_cmapUploads;
    checkGl("ImageRenderer::uploadColormap");
}

void ImageRenderer::setDisplay(const DisplaySettings& display) {
    m_display = display;
    if (m_initialized && (!m_cmapValid || m_uploadedCmap != display.colormap)) uploadColormap();
}

void ImageRenderer::setHistEqLut(std::span<const float> lut) {
    if (lut.size() < 2) return;
    glBindTexture(GL_TEXTURE_2D, m_lutTex);
    glPixelStorei(GL_UNPACK_ALIGNMENT, 4);
    glTexImage2D(GL_TEXTURE_2D, 0, GL_R32F, static_cast<GLsizei>(lut.size()), 1, 0, GL_RED, GL_FLOAT,
                 lut.data());
    glBindTexture(GL_TEXTURE_2D, 0);
    m_lutSize = static_cast<int>(lut.size());
    ++m_lutUploads;
    checkGl("ImageRenderer::setHistEqLut");
}

void ImageRenderer::uploadInstances(InstanceBuffer& buf, const void* data, std::size_t bytes, int count,
                                    bool ellipse) {
    if (!buf.vao) {
        glGenVertexArrays(1, &buf.vao);
        glGenBuffers(1, &buf.vbo);
        glBindVertexArray(buf.vao);
        glBindBuffer(GL_ARRAY_BUFFER, buf.vbo);
        if (ellipse) {
            glEnableVertexAttribArray(1);
            glVertexAttribPointer(1, 2, GL_FLOAT, GL_FALSE, kEllipseStride, reinterpret_cast<void*>(0));
            glVertexAttribDivisor(1, 1);
            glEnableVertexAttribArray(2);
            glVertexAttribPointer(2, 3, GL_FLOAT, GL_FALSE, kEllipseStride, reinterpret_cast<void*>(8));
            glVertexAttribDivisor(2, 1);
            glEnableVertexAttribArray(3);
            glVertexAttribPointer(3, 4, GL_UNSIGNED_BYTE, GL_TRUE, kEllipseStride,
                                  reinterpret_cast<void*>(20));
            glVertexAttribDivisor(3, 1);
        } else {
            glEnableVertexAttribArray(1);
            glVertexAttribPointer(1, 4, GL_FLOAT, GL_FALSE, kSegmentStride, reinterpret_cast<void*>(0));
            glVertexAttribDivisor(1, 1);
            glEnableVertexAttribArray(2);
            glVertexAttribPointer(2, 4, GL_UNSIGNED_BYTE, GL_TRUE, kSegmentStride,
                                  reinterpret_cast<void*>(16));
            glVertexAttribDivisor(2, 1);
        }
        glBindVertexArray(0);
    }
    glBindBuffer(GL_ARRAY_BUFFER, buf.vbo);
    if (bytes > buf.capacity || bytes < buf.capacity / 4) {
        glBufferData(GL_ARRAY_BUFFER, static_cast<GLsizeiptr>(bytes), data, GL_DYNAMIC_DRAW);
        buf.capacity = bytes;
    } else if (bytes > 0) {
        glBufferSubData(GL_ARRAY_BUFFER, 0, static_cast<GLsizeiptr>(bytes), data);
    }
    glBindBuffer(GL_ARRAY_BUFFER, 0);
    buf.count = count;
    checkGl("ImageRenderer::uploadInstances");
}

void ImageRenderer::setEllipses(EllipseLayer layer, std::span<const EllipseInstance> instances) {
    std::vector<float> axes;
    axes.reserve(instances.size());
    for (const EllipseInstance& e : instances)
        axes.push_back(std::max(e.a, e.b));
    float typical = 0;
    if (!axes.empty()) {
        const auto k = axes.begin() + static_cast<std::ptrdiff_t>(axes.size() * 9 / 10);
        std::nth_element(axes.begin(), k, axes.end());
        typical = *k;
    }
    // Large: over 4 times the typical size (and 8 image px), whose outlines need many more segments.
    const float large = std::max(4.0f * typical, 8.0f);
    std::vector<EllipseInstance> small, big;
    small.reserve(instances.size());
    for (const EllipseInstance& e : instances)
        (std::max(e.a, e.b) > large ? big : small).push_back(e);
    fillEllipses(m_ellipses[static_cast<std::size_t>(layer)], small, typical);
    fillEllipses(m_largeEllipses[static_cast<std::size_t>(layer)], big, typical);
}

// One buffer of ellipses: sorted by the cells of a grid over their centres, uploaded.
void ImageRenderer::fillEllipses(InstanceBuffer& buf, std::span<const EllipseInstance> instances,
                                 float typicalAxis) {
    float maxAxis = 0;
    double x0 = 0, y0 = 0, x1 = 0, y1 = 0;
    bool any = false;
    for (const EllipseInstance& e : instances) {
        maxAxis = std::max(maxAxis, std::max(e.a, e.b));
        if (!(std::abs(e.x) < 1e8f && std::abs(e.y) < 1e8f)) continue; // the far-away non-finite slots
        if (!any) {
            x0 = x1 = e.x;
            y0 = y1 = e.y;
            any = true;
        }
        x0 = std::min<double>(x0, e.x), x1 = std::max<double>(x1, e.x);
        y0 = std::min<double>(y0, e.y), y1 = std::max<double>(y1, e.y);
    }
    // A grid of at most 64 x 64 cells over the centres; counting sort of the instances by cell.
    const double extent = std::max(x1 - x0, y1 - y0);
    buf.cell = std::max(32.0, extent / 64.0);
    buf.gx0 = x0;
    buf.gy0 = y0;
    buf.nx = static_cast<int>((x1 - x0) / buf.cell) + 1;
    buf.ny = static_cast<int>((y1 - y0) / buf.cell) + 1;
    const auto cellOf = [&buf](const EllipseInstance& e) {
        const int cx = std::clamp(static_cast<int>(std::floor((e.x - buf.gx0) / buf.cell)), 0, buf.nx - 1);
        const int cy = std::clamp(static_cast<int>(std::floor((e.y - buf.gy0) / buf.cell)), 0, buf.ny - 1);
        return cy * buf.nx + cx;
    };
    buf.cellStart.assign(static_cast<std::size_t>(buf.nx * buf.ny) + 1, 0);
    for (const EllipseInstance& e : instances)
        ++buf.cellStart[static_cast<std::size_t>(cellOf(e)) + 1];
    for (std::size_t c = 1; c < buf.cellStart.size(); ++c)
        buf.cellStart[c] += buf.cellStart[c - 1];
    std::vector<EllipseInstance> sorted(instances.size());
    std::vector<int> next(buf.cellStart.begin(), buf.cellStart.end() - 1);
    for (const EllipseInstance& e : instances)
        sorted[static_cast<std::size_t>(next[static_cast<std::size_t>(cellOf(e))]++)] = e;
    uploadInstances(buf, sorted.data(), sorted.size() * sizeof(EllipseInstance),
                    static_cast<int>(sorted.size()), true);
    buf.maxAxis = maxAxis;
    buf.typicalAxis = typicalAxis;
}

void ImageRenderer::setEllipseAttributes(std::size_t first) {
    const auto base = [first](std::size_t offset) {
        return reinterpret_cast<void*>(first * kEllipseStride + offset);
    };
    glVertexAttribPointer(1, 2, GL_FLOAT, GL_FALSE, kEllipseStride, base(0));
    glVertexAttribPointer(2, 3, GL_FLOAT, GL_FALSE, kEllipseStride, base(8));
    glVertexAttribPointer(3, 4, GL_UNSIGNED_BYTE, GL_TRUE, kEllipseStride, base(20));
}

void ImageRenderer::setSegments(SegmentLayer layer, std::span<const SegmentInstance> instances) {
    uploadInstances(m_segments[static_cast<std::size_t>(layer)], instances.data(), instances.size_bytes(),
                    static_cast<int>(instances.size()), false);
}

std::array<int, 4> ImageRenderer::overviewRect(const ViewTransform& view,
                                               const RenderOptions& options) const {
    if (!options.overview || m_width <= 0 || m_height <= 0) return {0, 0, 0, 0};
    const double dpr = options.devicePixelRatio;
    const double side = std::min({160.0 * dpr, view.width * 0.3, view.height * 0.3});
    if (side < 24 * dpr) return {0, 0, 0, 0};
    // as the view shows the frame: a quarter turn swaps its sides
    const bool swap = view.orientation.swapsAxes();
    const double aspect =
        swap ? static_cast<double>(m_height) / m_width : static_cast<double>(m_width) / m_height;
    const int w = static_cast<int>(aspect >= 1 ? side : side * aspect);
    const int h = static_cast<int>(aspect >= 1 ? side / aspect : side);
    const int margin = static_cast<int>(8 * dpr);
    return {static_cast<int>(view.width) - w - margin, static_cast<int>(view.height) - h - margin, w, h};
}

ViewTransform ImageRenderer::overviewTransform(const ViewTransform& view,
                                               const RenderOptions& options) const {
    const auto r = overviewRect(view, options);
    ViewTransform t;
    t.width = std::max(1, r[2]);
    t.height = std::max(1, r[3]);
    t.cx = 0.5 * (m_width - 1);
    t.cy = 0.5 * (m_height - 1);
    t.orientation = view.orientation; // the inset turns and flips with the view
    const bool swap = view.orientation.swapsAxes();
    t.zoom =
        ViewTransform::fitZoom(swap ? m_height : m_width, swap ? m_width : m_height, t.width, t.height, 1.0);
    return t;
}

void ImageRenderer::drawImage(const ViewTransform& view, const RenderOptions& options, bool overview) {
    QOpenGLShaderProgram& p = *m_imageProg;
    p.bind();
    p.setUniformValue("u_image", 0);
    p.setUniformValue("u_seg", 1);
    p.setUniformValue("u_lut", 2);
    p.setUniformValue("u_cmap", 3);
    setViewUniforms(p, view);
    const StretchParams& s = m_display.stretch;
    p.setUniformValue("u_stretch", static_cast<int>(s.stretch));
    p.setUniformValue("u_lo", static_cast<float>(s.lo));
    p.setUniformValue("u_hi", static_cast<float>(s.hi));
    p.setUniformValue("u_asinhS", s.asinhSoftening);
    p.setUniformValue("u_logA", s.logExponent);
    p.setUniformValue("u_lutSize", m_lutSize);
    const bool seg = m_hasSeg && options.segmentation && !overview;
    p.setUniformValue("u_hasSeg", seg ? 1 : 0);
    const bool rgb = m_hasRgb && m_display.colour;
    p.setUniformValue("u_rgb", 4);
    p.setUniformValue("u_hasRgb", rgb ? 1 : 0);
    const auto& lo = m_display.colourLo;
    const auto& hi = m_display.colourHi;
    p.setUniformValue("u_loRgb", lo[0], lo[1], lo[2]);
    p.setUniformValue("u_hiRgb", hi[0], hi[1], hi[2]);
    p.setUniformValue("u_segAlpha", m_display.segmentationAlpha);
    const auto& nc = m_display.nanColour;
    p.setUniformValue("u_nanColor", nc[0], nc[1], nc[2], nc[3]);
    glActiveTexture(GL_TEXTURE2);
    glBindTexture(GL_TEXTURE_2D, m_lutTex);
    glActiveTexture(GL_TEXTURE3);
    glBindTexture(GL_TEXTURE_2D, m_cmapTex);
    glBindVertexArray(m_quadVao);
    const auto vis = view.visibleImageRect();
    // Level of detail: the coarsest level whose pixel is still >= one screen pixel (factor * zoom <= 1).
    const LodTiles* lod = nullptr;
    if (m_lodEnabled && !seg && !rgb) // (the levels are the image's, not the colour planes')
        for (const LodTiles& l : m_lod)
            if (l.factor * view.zoom <= 1.0) lod = &l;
    if (!overview) m_lastLodFactor = lod ? lod->factor : 1;
    const int f = lod ? lod->factor : 1;
    p.setUniformValue("u_texScale", static_cast<float>(f));
    for (const Tile& t : lod ? lod->tiles : m_tiles) {
        // the tile's region of the frame, image px (a level's last row/column of tiles may reach past the
        // frame's edge: clipped to it)
        const int x0 = t.x0 * f, y0 = t.y0 * f;
        const int w = std::min(t.w * f, m_width - x0), h = std::min(t.h * f, m_height - y0);
        if (x0 - 0.5 > vis[2] || x0 + w - 0.5 < vis[0] || y0 - 0.5 > vis[3] || y0 + h - 0.5 < vis[1])
            continue;
        glActiveTexture(GL_TEXTURE0);
        glBindTexture(GL_TEXTURE_2D, t.tex);
        glActiveTexture(GL_TEXTURE1);
        glBindTexture(GL_TEXTURE_2D, seg && t.seg ? t.seg : m_dummySeg);
        glActiveTexture(GL_TEXTURE4);
        glBindTexture(GL_TEXTURE_2D, rgb ? t.rgb : 0);
        p.setUniformValue("u_tile", static_cast<float>(x0), static_cast<float>(y0), static_cast<float>(w),
                          static_cast<float>(h));
        glDrawArrays(GL_TRIANGLE_STRIP, 0, 4);
    }
    glBindVertexArray(0);
    glActiveTexture(GL_TEXTURE0);
    p.release();
}

std::array<int, 3> ImageRenderer::drawEllipses(const InstanceBuffer& buf, const ViewTransform& view,
                                               float lineWidthPx, float minRadiusPx, bool point,
                                               float pointPx, const QVector4D& halo) {
    if (buf.count <= 0) return {0, 0, 0};
    QOpenGLShaderProgram& p = *m_ellipseProg;
    p.bind();
    setViewUniforms(p, view);
    p.setUniformValue("u_halo", halo);
    p.setUniformValue("u_viewport", static_cast<float>(view.width), static_cast<float>(view.height));
    p.setUniformValue("u_zoom", static_cast<float>(view.zoom));
    const int n = ellipseSegments(std::max(minRadiusPx, static_cast<float>(buf.maxAxis * view.zoom)));
    p.setUniformValue("u_segments", n);
    p.setUniformValue("u_lineWidth", lineWidthPx);
    p.setUniformValue("u_minRadiusPx", minRadiusPx);
    p.setUniformValue("u_point", point ? 1 : 0);
    p.setUniformValue("u_pointPx", pointPx);
    const int verts = point ? 4 : 2 * (n + 1);

    // CPU grid culling: the runs of cells that overlap the visible rectangle (grown by the largest
    // outline), one instanced draw per grid row; everything in one draw when all cells are visible.
    const auto vis = view.visibleImageRect();
    const double margin = buf.maxAxis + (std::max(minRadiusPx, pointPx) + 4.0 * lineWidthPx) / view.zoom;
    const auto cellRange = [&buf](double lo, double hi, double g0, int count) {
        const double a = std::floor((lo - g0) / buf.cell), b = std::floor((hi - g0) / buf.cell);
        return std::array<int, 2>{static_cast<int>(std::clamp(a, 0.0, count - 1.0)),
                                  static_cast<int>(std::clamp(b, -1.0, count - 1.0))};
    };
    const auto xr = cellRange(vis[0] - margin, vis[2] + margin, buf.gx0, buf.nx);
    const auto yr = cellRange(vis[1] - margin, vis[3] + margin, buf.gy0, buf.ny);
    // (Only the far-away slots of non-finite positions lie outside the grid: clamped into its edge cells.)
    const bool all = xr[0] == 0 && yr[0] == 0 && xr[1] == buf.nx - 1 && yr[1] == buf.ny - 1;
    int drawn = 0, calls = 0;
    glBindVertexArray(buf.vao);
    if (all || buf.cellStart.empty()) {
        glDrawArraysInstanced(GL_TRIANGLE_STRIP, 0, verts, buf.count);
        drawn = buf.count;
        calls = 1;
    } else {
        glBindBuffer(GL_ARRAY_BUFFER, buf.vbo);
        for (int cy = yr[0]; cy <= yr[1]; ++cy) {
            const int first = buf.cellStart[static_cast<std::size_t>(cy * buf.nx + xr[0])];
            const int last = buf.cellStart[static_cast<std::size_t>(cy * buf.nx + xr[1] + 1)];
            if (last <= first) continue;
            setEllipseAttributes(static_cast<std::size_t>(first));
            glDrawArraysInstanced(GL_TRIANGLE_STRIP, 0, verts, last - first);
            drawn += last - first;
            ++calls;
        }
        setEllipseAttributes(0);
        glBindBuffer(GL_ARRAY_BUFFER, 0);
    }
    glBindVertexArray(0);
    p.release();
    return {drawn, verts, calls};
}

void ImageRenderer::drawSegments(const InstanceBuffer& buf, const ViewTransform& view, float lineWidthPx,
                                 float headPx, const QVector4D& halo) {
    if (buf.count <= 0) return;
    QOpenGLShaderProgram& p = *m_segmentProg;
    p.bind();
    setViewUniforms(p, view);
    p.setUniformValue("u_halo", halo);
    p.setUniformValue("u_viewport", static_cast<float>(view.width), static_cast<float>(view.height));
    p.setUniformValue("u_lineWidth", lineWidthPx);
    p.setUniformValue("u_headPx", headPx);
    glBindVertexArray(buf.vao);
    glDrawArraysInstanced(GL_TRIANGLES, 0, 9, buf.count);
    glBindVertexArray(0);
    p.release();
}

void ImageRenderer::render(const ViewTransform& view, const RenderOptions& options) {
    QElapsedTimer timer;
    timer.start();
    const auto& bg = m_display.background;
    glViewport(0, 0, static_cast<int>(view.width), static_cast<int>(view.height));
    glDisable(GL_DEPTH_TEST);
    glDisable(GL_CULL_FACE);
    glDisable(GL_SCISSOR_TEST);
    glClearColor(bg[0], bg[1], bg[2], bg[3]);
    glClear(GL_COLOR_BUFFER_BIT);
    if (!m_initialized) return;
    if (!m_tiles.empty()) drawImage(view, options, false);

    glEnable(GL_BLEND);
    glBlendFunc(GL_SRC_ALPHA, GL_ONE_MINUS_SRC_ALPHA);
    const float dpr = static_cast<float>(options.devicePixelRatio);
    const float lw = options.lineWidth * dpr;
    m_stats = {};
    const auto ellipses = [&](EllipseLayer l, float minRadiusPx, bool allowPoint, float skipBelowPx) {
        const std::size_t i = static_cast<std::size_t>(l);
        const InstanceBuffer& b = m_ellipses[i];
        const InstanceBuffer& big = m_largeEllipses[i];
        if (!options.ellipses[i] || b.count + big.count <= 0) return;
        const float typicalPx = static_cast<float>(b.typicalAxis * view.zoom);
        if (typicalPx < skipBelowPx * dpr) return; // too small to read: not drawn at all
        const bool point = allowPoint && typicalPx < kPointLodPx * dpr;
        const float width = (l == EllipseLayer::Selected ? 2.5f
                             : l == EllipseLayer::Series ? 1.8f
                                                         : 1.0f) *
                            lw;
        // A dark halo a device pixel wider on each side first: the outlines stay visible on any colormap.
        for (const InstanceBuffer* buf : {&b, &big})
            drawEllipses(*buf, view, width + 2.0f * dpr, minRadiusPx, point, (kPointPx + 2.0f) * dpr, kHalo);
        const auto r = drawEllipses(b, view, width, minRadiusPx, point, kPointPx * dpr);
        const auto rl = drawEllipses(big, view, width, minRadiusPx, point, kPointPx * dpr);
        m_stats.instancesDrawn[i] = r[0] + rl[0];
        m_stats.verticesPerInstance[i] = b.count > 0 ? r[1] : rl[1]; // of the many small ones
        m_stats.drawCalls[i] = r[2] + rl[2];
    };
    ellipses(EllipseLayer::Apertures, 0.0f, false, kApertureLodPx);
    ellipses(EllipseLayer::Sources, 2.0f * dpr, true, 0.0f);
    ellipses(EllipseLayer::ReferenceStars, 5.0f * dpr, false, 0.0f);
    ellipses(EllipseLayer::Series, 7.0f * dpr, false, 0.0f);
    for (int k : {0, 1})
        if (options.segments[k]) {
            drawSegments(m_segments[k], view, lw + 2.0f * dpr, k == 1 ? 6.0f * dpr : 0.0f, kHalo);
            drawSegments(m_segments[k], view, lw, k == 1 ? 6.0f * dpr : 0.0f);
        }
    ellipses(EllipseLayer::Selected, 4.0f * dpr, false, 0.0f);
    drawCrosshair(view, options);

    const auto r = overviewRect(view, options);
    if (r[2] > 0 && !m_tiles.empty()) {
        const int glY = static_cast<int>(view.height) - r[1] - r[3];
        glEnable(GL_SCISSOR_TEST);
        glScissor(r[0], glY, r[2], r[3]);
        glViewport(r[0], glY, r[2], r[3]);
        glClearColor(0, 0, 0, 1);
        glClear(GL_COLOR_BUFFER_BIT);
        const ViewTransform ov = overviewTransform(view, options);
        glDisable(GL_BLEND);
        drawImage(ov, options, true);
        glEnable(GL_BLEND);
        // Border of the inset and the visible rectangle, as segments in the overview's image coordinates.
        const auto vis = view.visibleImageRect();
        const float x0 = static_cast<float>(std::max(vis[0], -0.5)),
                    y0 = static_cast<float>(std::max(vis[1], -0.5));
        const float x1 = static_cast<float>(std::min(vis[2], m_width - 0.5));
        const float y1 = static_cast<float>(std::min(vis[3], m_height - 0.5));
        const float bx0 = -0.5f, by0 = -0.5f, bx1 = m_width - 0.5f, by1 = m_height - 0.5f;
        const std::uint32_t red = packRgba(255, 64, 64), grey = packRgba(160, 160, 160);
        // Grey border first, the red visible rectangle over it.
        const SegmentInstance segs[8] = {{bx0, by0, bx1 - bx0, 0, grey}, {bx1, by0, 0, by1 - by0, grey},
                                         {bx1, by1, bx0 - bx1, 0, grey}, {bx0, by1, 0, by0 - by1, grey},
                                         {x0, y0, x1 - x0, 0, red},      {x1, y0, 0, y1 - y0, red},
                                         {x1, y1, x0 - x1, 0, red},      {x0, y1, 0, y0 - y1, red}};
        uploadInstances(m_frameSegments, segs, sizeof segs, (x1 > x0 && y1 > y0) ? 8 : 4, false);
        drawSegments(m_frameSegments, ov, 1.5f * dpr, 0.0f);
        glDisable(GL_SCISSOR_TEST);
        glViewport(0, 0, static_cast<int>(view.width), static_cast<int>(view.height));
    }
    drawMagnifier(view, options); // over the overview where they meet: it follows the cursor
    glDisable(GL_BLEND);
    if (m_finishEachFrame) glFinish();
    checkGl("ImageRenderer::render");
    m_lastRenderMs = static_cast<double>(timer.nsecsElapsed()) * 1e-6;
}

} // namespace gpuphot::viewers

namespace gpuphot::viewers {

void ImageRenderer::drawCrosshair(const ViewTransform& view, const RenderOptions& options) {
    const double x = options.crosshairX, y = options.crosshairY;
    if (!std::isfinite(x) || !std::isfinite(y) || m_tiles.empty()) return;
    // Two lines through (x, y), across the whole view whatever the orientation: along the image axes
    // that lie horizontal and vertical on screen.
    const double reach = (view.width + view.height) / view.zoom;
    const auto h = view.orientation.invert(1, 0), v = view.orientation.invert(0, 1);
    const auto f = [](double d) { return static_cast<float>(d); };
    const std::uint32_t c = options.crosshairColour;
    const SegmentInstance segs[2] = {
        {f(x - reach * h[0]), f(y - reach * h[1]), f(2 * reach * h[0]), f(2 * reach * h[1]), c},
        {f(x - reach * v[0]), f(y - reach * v[1]), f(2 * reach * v[0]), f(2 * reach * v[1]), c}};
    uploadInstances(m_crosshairSegments, segs, sizeof segs, 2, false);
    drawSegments(m_crosshairSegments, view, static_cast<float>(options.devicePixelRatio), 0.0f);
}

void ImageRenderer::drawMagnifier(const ViewTransform& view, const RenderOptions& options) {
    const MagnifierOptions& m = options.magnifier;
    if (m.side <= 0 || !std::isfinite(m.x) || !std::isfinite(m.y) || m_tiles.empty()) return;
    const int glY = static_cast<int>(view.height) - m.top - m.side;
    glEnable(GL_SCISSOR_TEST);
    glScissor(m.left, glY, m.side, m.side);
    glViewport(m.left, glY, m.side, m.side);
    const auto& bg = m_display.background;
    glClearColor(bg[0], bg[1], bg[2], bg[3]);
    glClear(GL_COLOR_BUFFER_BIT);
    ViewTransform mv = view;
    mv.cx = m.x;
    mv.cy = m.y;
    mv.zoom = m.zoom;
    mv.width = mv.height = m.side;
    glDisable(GL_BLEND);
    drawImage(mv, options, true);
    glEnable(GL_BLEND);
    // The border of the inset and the outline of the pixel under the cursor.
    const double half = 0.5 * m.side / m.zoom;
    const float px = static_cast<float>(std::round(m.x)), py = static_cast<float>(std::round(m.y));
    const float b0x = static_cast<float>(m.x - half), b0y = static_cast<float>(m.y - half);
    const float b1x = static_cast<float>(m.x + half), b1y = static_cast<float>(m.y + half);
    const std::uint32_t grey = packRgba(200, 200, 200), c = options.crosshairColour;
    const SegmentInstance segs[8] = {{b0x, b0y, b1x - b0x, 0, grey},   {b1x, b0y, 0, b1y - b0y, grey},
                                     {b1x, b1y, b0x - b1x, 0, grey},   {b0x, b1y, 0, b0y - b1y, grey},
                                     {px - 0.5f, py - 0.5f, 1, 0, c},  {px + 0.5f, py - 0.5f, 0, 1, c},
                                     {px + 0.5f, py + 0.5f, -1, 0, c}, {px - 0.5f, py + 0.5f, 0, -1, c}};
    uploadInstances(m_magnifierSegments, segs, sizeof segs, 8, false);
    drawSegments(m_magnifierSegments, mv, 2.0f * static_cast<float>(options.devicePixelRatio), 0.0f);
    glDisable(GL_SCISSOR_TEST);
    glViewport(0, 0, static_cast<int>(view.width), static_cast<int>(view.height));
}

} // namespace gpuphot::viewers
