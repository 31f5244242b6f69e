#pragma once
// Overlay geometry of the image viewer, Qt-free: per-instance records that the renderer copies into one
// VBO per layer and draws instanced (the outline of an ellipse and the quad of a line segment are made in
// the vertex shader, resources/shaders/ellipse.vert.glsl and segment.vert.glsl). ellipseOutlinePoint()
// and segmentEnds() are the CPU reference of those shaders. Image coordinates: 0-based pixels.
#include <array>
#include <cstdint>
#include <span>
#include <vector>

namespace gpuphot::viewers {

struct Marker {
    float x, y, a, b, theta; // 0-based px; a, b semi-axes (px); theta deg CCW from +x
    std::uint32_t flags;
};
struct Vector2 {
    float x, y, dx, dy; // 0-based px
};

// RGBA8 packed as r | g << 8 | b << 16 | a << 24 (the byte order of GL_UNSIGNED_BYTE x4 on little-endian).
constexpr std::uint32_t packRgba(int r, int g, int b, int a = 255) {
    return static_cast<std::uint32_t>(r & 255) | static_cast<std::uint32_t>(g & 255) << 8 |
           static_cast<std::uint32_t>(b & 255) << 16 | static_cast<std::uint32_t>(a & 255) << 24;
}

// 24 bytes, the layout of the instance VBO (attribute locations 1..3 in ellipse.vert.glsl).
struct EllipseInstance {
    float x, y;        // centre, image px
    float a, b;        // semi-axes, image px (drawn at least minRadiusPx screen px)
    float theta;       // radians CCW from +x
    std::uint32_t rgba;
};
// 20 bytes: a segment from (x, y) to (x + dx, y + dy), image px; an arrow head at the end when asked.
struct SegmentInstance {
    float x, y, dx, dy;
    std::uint32_t rgba;
};
static_assert(sizeof(EllipseInstance) == 24 && sizeof(SegmentInstance) == 20);

struct OverlayStyle {
    float sourceScale = 3.0f; // ellipses drawn with semi-axes scale * (a, b) (kron-like)
    float minSemiAxis = 1.0f; // image px: a, b never drawn smaller
    std::uint32_t sourceColour = packRgba(0, 230, 0);
    std::uint32_t flaggedColour = packRgba(255, 140, 0);
    std::uint32_t selectedColour = packRgba(255, 255, 0);
    std::uint32_t apertureColour = packRgba(0, 200, 255);
    std::uint32_t annulusColour = packRgba(255, 80, 200);
    std::uint32_t whiskerColour = packRgba(255, 255, 255);
    std::uint32_t referenceColour = packRgba(80, 160, 255);
    std::uint32_t residualColour = packRgba(255, 60, 60);
    float whiskerScale = 1.0f;
    float referenceRadius = 6.0f; // image px (the renderer also keeps it >= a few screen px)
};

std::vector<EllipseInstance> buildSourceEllipses(std::span<const Marker> markers, const OverlayStyle& style);
// One circle per source and radius, then the annulus' inner and outer circle (skipped when <= 0).
std::vector<EllipseInstance> buildApertureCircles(std::span<const Marker> markers, std::span<const float> radii,
                                                  float annulusInner, float annulusOuter, const OverlayStyle& style);
std::vector<EllipseInstance> buildReferenceCircles(std::span<const Vector2> positions, const OverlayStyle& style);
// Headless whiskers centred on (x, y), length whiskerScale * |(dx, dy)|.
std::vector<SegmentInstance> buildWhiskers(std::span<const Vector2> whiskers, const OverlayStyle& style);
// Arrows from (x, y) to (x, y) + exaggeration * (dx, dy).
std::vector<SegmentInstance> buildResidualArrows(std::span<const Vector2> vectors, float exaggeration,
                                                 const OverlayStyle& style);

// CPU reference of ellipse.vert.glsl: the image position of outline vertex k of n around the ellipse
// (before the screen-space line width is added): angle 2 pi k / n.
std::array<float, 2> ellipseOutlinePoint(const EllipseInstance& e, int k, int n);
// Number of outline vertices for a semi-major axis of axisPx screen px (more when larger, 8..128).
int ellipseSegments(float axisPx);

} // namespace gpuphot::viewers
