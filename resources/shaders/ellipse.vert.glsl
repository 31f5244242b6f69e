// Instanced ellipse outlines: a triangle strip of 2 (u_segments + 1) vertices per instance, the outline
// point k at angle 2 pi k / n (viewers/overlay_geometry.cpp ellipseOutlinePoint is the CPU reference)
// widened by u_lineWidth device pixels along the normal. Level of detail: with u_point != 0 each instance is
// a 4-vertex strip, a filled square u_pointPx device pixels wide at the centre (markers below ~2 px).
layout(location = 1) in vec2 i_center;
layout(location = 2) in vec3 i_abt; // a, b (image px), theta (rad CCW from +x)
layout(location = 3) in vec4 i_rgba;
uniform vec2 u_center;
uniform vec2 u_scale;     // clip units per image pixel
uniform vec2 u_viewport;  // device pixels
uniform float u_zoom;     // device pixels per image pixel
uniform int u_segments;
uniform float u_lineWidth;   // device px
uniform float u_minRadiusPx; // device px
uniform int u_point;         // 1: draw a square dot of u_pointPx device px instead of the outline
uniform float u_pointPx;
uniform vec4 u_halo;     // alpha > 0: every instance in this colour (the dark halo pass under the outlines)
uniform vec4 u_orient;   // row-major 2x2: image offset -> screen offset (flips, quarter turns)
vec2 orient(vec2 d) { return vec2(u_orient.x * d.x + u_orient.y * d.y, u_orient.z * d.x + u_orient.w * d.y); }
out vec4 v_color;
void main() {
    float a = max(i_abt.x, u_minRadiusPx / u_zoom);
    float b = max(i_abt.y, u_minRadiusPx / u_zoom);
    vec2 cclip = orient(i_center - u_center) * u_scale;
    float rclip = a * max(u_scale.x, u_scale.y) + 4.0 * u_lineWidth / min(u_viewport.x, u_viewport.y);
    v_color = u_halo.a > 0.0 ? u_halo : i_rgba;
    if (abs(cclip.x) > 1.0 + rclip || abs(cclip.y) > 1.0 + rclip) { // culled: a degenerate strip off-screen
        gl_Position = vec4(2.0, 2.0, 2.0, 1.0);
        return;
    }
    if (u_point != 0) {
        vec2 corner = vec2((gl_VertexID & 1) != 0 ? 0.5 : -0.5, (gl_VertexID & 2) != 0 ? 0.5 : -0.5);
        gl_Position = vec4(cclip + corner * u_pointPx * 2.0 / u_viewport, 0.0, 1.0);
        return;
    }
    int k = gl_VertexID / 2;
    float side = (gl_VertexID % 2 == 0) ? -0.5 : 0.5;
    float phi = 6.28318530718 * float(k) / float(u_segments);
    float c = cos(i_abt.z), s = sin(i_abt.z);
    vec2 uv = vec2(a * cos(phi), b * sin(phi));
    vec2 p = i_center + vec2(c * uv.x - s * uv.y, s * uv.x + c * uv.y);
    vec2 nl = vec2(b * cos(phi), a * sin(phi));
    vec2 n = normalize(vec2(c * nl.x - s * nl.y, s * nl.x + c * nl.y));
    vec2 clip = orient(p - u_center) * u_scale + orient(n) * side * u_lineWidth * 2.0 / u_viewport;
    gl_Position = vec4(clip, 0.0, 1.0);
}
