#pragma once
// The OpenGL renderer of the image viewer. Needs only a current OpenGL 3.3 core or OpenGL ES 3.0 context
// and Qt's function loader: no widget. Float pixels are uploaded once as R32F textures in tiles of at most
// GL_MAX_TEXTURE_SIZE; stretch, limits and colormap are uniforms plus two small textures (colormap, histogram
// equalisation table), so changing them never re-uploads pixels. Overlays are instanced: one VBO of
// per-instance records per layer (viewers/overlay_geometry.hpp), outlines generated in the vertex shader.
// Level of detail keeps dense catalogues cheap: markers smaller than ~2 screen px are drawn as one dot each,
// apertures below a few px are not drawn, outlines get fewer segments when small (ellipseSegments), and
// ellipse instances are stored sorted by the cells of a coarse grid so a zoomed-in frame submits only the
// cells in view (a few attribute-pointer offsets per frame; nothing is re-uploaded on pan or zoom).
// Every method except the constructor, the accessors and the setters of plain state must be called with
// the context current; destroy() too, before the context goes away.
#include <QOpenGLExtraFunctions>
#include <QVector4D>

#include <array>
#include <cstdint>
#include <limits>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/model/image.hpp"
#include "viewers/overlay_geometry.hpp"
#include "viewers/stretch.hpp"
#include "viewers/view_transform.hpp"

class QOpenGLShaderProgram;

namespace gpuphot::viewers {

enum class EllipseLayer { Sources, Apertures, ReferenceStars, Series, Selected, Count };
enum class SegmentLayer { PsfWhiskers, Residuals, Count };

struct DisplaySettings {
    StretchParams stretch;
    Colormap colormap = Colormap::Grey;
    float segmentationAlpha = 0.35f;
    std::array<float, 4> nanColour{0.15f, 0.0f, 0.2f, 1.0f};
    std::array<float, 4> background{0.08f, 0.08f, 0.1f, 1.0f};
    // Colour composite (uploadColourPlanes): drawn instead of the image when set, each plane stretched with
    // its own limits (the stretch's lo and hi are the image's), no colormap.
    bool colour = false;
    std::array<float, 3> colourLo{0, 0, 0}, colourHi{1, 1, 1};
};

// Level of detail (device px): below kPointLodPx a marker's typical semi-axis on screen draws as a dot of
// kPointPx; apertures/annuli whose typical radius is below kApertureLodPx are not drawn at all.
inline constexpr float kPointLodPx = 2.0f;
inline constexpr float kPointPx = 3.0f;
// The overlays' halo: drawn under every outline, marker and segment, a device pixel wider on each side,
// so that they stay visible on any colormap (blue circles on a blue image, white whiskers on white).
inline const QVector4D kHalo{0.0f, 0.0f, 0.0f, 0.6f};
inline constexpr float kApertureLodPx = 3.0f;

// What the last render() drew per ellipse layer (diagnostics for tests and benchmarks).
struct RenderStats {
    std::array<int, static_cast<int>(EllipseLayer::Count)>
        instancesDrawn{}; // instances submitted (after CPU grid culling)
    std::array<int, static_cast<int>(EllipseLayer::Count)>
        verticesPerInstance{}; // 4: dot (LOD), 2 (n + 1): outline of n segments, 0: skipped
    std::array<int, static_cast<int>(EllipseLayer::Count)> drawCalls{};
};

// The magnifier inset (DS9's magnifier): the pixels around (x, y) at `zoom` device px per image px in a
// square of `side` device px whose top-left corner is (left, top), origin top-left; side 0: none.
struct MagnifierOptions {
    double x = 0, y = 0;
    double zoom = 8;
    int left = 0, top = 0, side = 0;
};

struct RenderOptions {
    std::array<bool, static_cast<int>(EllipseLayer::Count)> ellipses{true, true, true, true, true};
    std::array<bool, static_cast<int>(SegmentLayer::Count)> segments{true, true};
    bool segmentation = true;
    bool overview = true;
    double devicePixelRatio = 1.0;
    float lineWidth = 1.5f; // logical px
    // DS9's crosshair: a horizontal and a vertical line across the view through this image position
    // (NaN: none).
    double crosshairX = std::numeric_limits<double>::quiet_NaN();
    double crosshairY = std::numeric_limits<double>::quiet_NaN();
    std::uint32_t crosshairColour = packRgba(80, 255, 80);
    MagnifierOptions magnifier;
};

class ImageRenderer : protected QOpenGLExtraFunctions {
public:
    ImageRenderer();
    ~ImageRenderer();
    ImageRenderer(const ImageRenderer&) = delete;
    ImageRenderer& operator=(const ImageRenderer&) = delete;

    // Compiles the shaders; throws std::runtime_error with the log when they do not compile.
    void initialize();
    void destroy(); // frees the GL objects (context current)
    bool initialized() const { return m_initialized; }
    bool isOpenGLES() const { return m_es; }
    int maxTextureSize() const { return m_maxTexture; }
    void setMaxTileSize(int size) { m_tileLimit = size; } // 0: GL_MAX_TEXTURE_SIZE (tests force tiling)

    void uploadImage(const ImageViewT<float>& image); // one glTexImage2D per tile
    void clearImage();
    void uploadSegmentation(const ImageViewT<std::int32_t>& seg); // same size as the image, else ignored
    void clearSegmentation();
    // Red, green and blue planes of the image's size (else ignored), drawn when DisplaySettings::colour is set.
    void uploadColourPlanes(const ImageViewT<float>& red, const ImageViewT<float>& green,
                            const ImageViewT<float>& blue);
    void clearColourPlanes();
    bool hasColourPlanes() const { return m_hasRgb; }
    // Level of detail (viewers/image_lod.hpp): a reduced copy of the uploaded image, `factor` full-resolution
    // pixels per level pixel, tiled like the image. render() draws the coarsest level with factor <= 1 /
    // zoom (a level pixel no smaller than a screen pixel) instead of the full-resolution tiles, except
    // where the segmentation layer is drawn (it is kept at full resolution). Cleared with the image.
    void uploadLodLevel(int factor, const ImageViewT<float>& level);
    void clearLod();
    int lodLevelCount() const { return static_cast<int>(m_lod.size()); }
    void setLodEnabled(bool on) { m_lodEnabled = on; }    // default on (off: always full resolution)
    int lastLodFactor() const { return m_lastLodFactor; } // main view of the last render (1: full resolution)
    int imageWidth() const { return m_width; }
    int imageHeight() const { return m_height; }
    int tileCount() const { return static_cast<int>(m_tiles.size()); }

    void setDisplay(const DisplaySettings& display); // uniforms; the colormap texture when it changes
    void setHistEqLut(std::span<const float> lut);   // the small LUT texture

    void setEllipses(EllipseLayer layer, std::span<const EllipseInstance> instances);
    void setSegments(SegmentLayer layer, std::span<const SegmentInstance> instances);

    // Draws into the currently bound framebuffer; view in device pixels.
    void render(const ViewTransform& view, const RenderOptions& options);
    // The overview inset rectangle in device pixels, origin top-left: {x, y, w, h}; w = 0 when none.
    std::array<int, 4> overviewRect(const ViewTransform& view, const RenderOptions& options) const;
    ViewTransform overviewTransform(const ViewTransform& view, const RenderOptions& options) const;

    // Counters and diagnostics.
    int pixelUploads() const { return m_pixelUploads; } // R32F tile uploads since construction
    int segmentationUploads() const { return m_segUploads; }
    int lutUploads() const { return m_lutUploads; }
    int colormapUploads() const { return m_cmapUploads; }
    std::vector<std::string> takeGlErrors(); // glGetError results recorded so far, "where: 0x...."
    void setTiming(bool finish) { m_finishEachFrame = finish; } // glFinish at the end of render (benchmarks)
    double lastRenderMs() const { return m_lastRenderMs; }
    const RenderStats& lastStats() const { return m_stats; }

private:
    struct Tile {
        int x0, y0, w, h;
        unsigned tex = 0, seg = 0, rgb = 0;
    };
    struct InstanceBuffer {
        unsigned vao = 0, vbo = 0;
        int count = 0;
        std::size_t capacity = 0;
        float maxAxis = 0;     // ellipses: largest semi-axis, image px (segment count, culling margin)
        float typicalAxis = 0; // ellipses: 90th percentile of the larger semi-axis (point / skip LOD)
        // Ellipses are uploaded sorted by the cell of a coarse grid over their centres, so the instances of
        // one grid row's run of visible cells are contiguous: drawn by offsetting the attribute pointers.
        double gx0 = 0, gy0 = 0, cell = 1;
        int nx = 0, ny = 0;
        std::vector<int> cellStart; // nx * ny + 1 offsets into the sorted instances
    };
    struct LodTiles {
        int factor = 1, width = 0, height = 0; // level pixels
        std::vector<Tile> tiles;               // in level pixels
    };
    void uploadTiles(const ImageViewT<float>& image, std::vector<Tile>& tiles);
    void makeNearestTexture(unsigned& tex);
    void deleteTileTextures(unsigned Tile::*which); // of m_tiles
    void checkGl(const char* where);
    void drawImage(const ViewTransform& view, const RenderOptions& options, bool overview);
    // Returns {instances drawn, vertices per instance, draw calls}.
    std::array<int, 3> drawEllipses(const InstanceBuffer& buf, const ViewTransform& view, float lineWidthPx,
                                    float minRadiusPx, bool point, float pointPx, const QVector4D& halo = {});
    void fillEllipses(InstanceBuffer& buf, std::span<const EllipseInstance> instances, float typicalAxis);
    void setEllipseAttributes(std::size_t firstInstance);
    void drawSegments(const InstanceBuffer& buf, const ViewTransform& view, float lineWidthPx, float headPx,
                      const QVector4D& halo = {});
    void drawCrosshair(const ViewTransform& view, const RenderOptions& options);
    void drawMagnifier(const ViewTransform& view, const RenderOptions& options);
    void uploadInstances(InstanceBuffer& buf, const void* data, std::size_t bytes, int count, bool ellipse);
    void uploadColormap();

    bool m_initialized = false;
    bool m_es = false;
    int m_maxTexture = 0;
    int m_tileLimit = 0;
    int m_width = 0, m_height = 0;
    std::vector<Tile> m_tiles;
    std::vector<LodTiles> m_lod; // by increasing factor
    bool m_lodEnabled = true;
    int m_lastLodFactor = 1;
    bool m_hasSeg = false, m_hasRgb = false;
    std::unique_ptr<QOpenGLShaderProgram> m_imageProg, m_ellipseProg, m_segmentProg;
    unsigned m_quadVao = 0, m_quadVbo = 0;
    unsigned m_lutTex = 0, m_cmapTex = 0, m_dummySeg = 0;
    int m_lutSize = 0;
    DisplaySettings m_display;
    Colormap m_uploadedCmap = Colormap::Grey;
    bool m_cmapValid = false;
    // Each layer's ellipses in two buffers: every outline of a draw has the vertices of its largest one, so
    // the few much larger than the layer's typical size (a bleed trail's isophote, a galaxy's Kron
    // ellipse) are drawn apart and the many small ones keep few vertices.
    std::array<InstanceBuffer, static_cast<int>(EllipseLayer::Count)> m_ellipses, m_largeEllipses;
    std::array<InstanceBuffer, static_cast<int>(SegmentLayer::Count)> m_segments;
    InstanceBuffer m_frameSegments; // overview border and visible rectangle
    InstanceBuffer m_crosshairSegments, m_magnifierSegments;
    int m_pixelUploads = 0, m_segUploads = 0, m_lutUploads = 0, m_cmapUploads = 0;
    std::vector<std::string> m_glErrors;
    bool m_finishEachFrame = false;
    double m_lastRenderMs = 0;
    RenderStats m_stats;
};

} // namespace gpuphot::viewers
