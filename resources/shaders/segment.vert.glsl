// Instanced line segments (whiskers, residual arrows, frames): 9 vertices per instance drawn as
// GL_TRIANGLES, a quad u_lineWidth device px wide from (x, y) to (x + dx, y + dy) and, when u_headPx > 0,
// an arrow head of that length at the end.
layout(location = 1) in vec4 i_seg; // x, y, dx, dy (image px)
layout(location = 2) in vec4 i_rgba;
uniform vec2 u_center;
uniform vec2 u_scale;
uniform vec2 u_viewport;
uniform float u_lineWidth;
uniform float u_headPx;
uniform vec4 u_halo;     // alpha > 0: every instance in this colour (the dark halo pass under the segments)
uniform vec4 u_orient;   // row-major 2x2: image offset -> screen offset (flips, quarter turns)
vec2 orient(vec2 d) { return vec2(u_orient.x * d.x + u_orient.y * d.y, u_orient.z * d.x + u_orient.w * d.y); }
out vec4 v_color;
// Without a head its triangle is sent outside the clip volume rather than collapsed onto the segment's end
// (a zero-area triangle): with that, Mesa's llvmpipe draws nothing of the segment unless it touches the
// viewport's edge, and the overview's visible rectangle and the PSF whiskers would not show.
void main() {
    v_color = u_halo.a > 0.0 ? u_halo : i_rgba;
    vec2 p0 = orient(i_seg.xy - u_center) * u_scale;
    vec2 dpx = orient(i_seg.zw) * u_scale * u_viewport * 0.5;
    float len = length(dpx);
    vec2 dir = len > 0.0 ? dpx / len : vec2(1.0, 0.0);
    vec2 nrm = vec2(-dir.y, dir.x);
    float head = u_headPx > 0.0 ? min(u_headPx, 0.5 * len) : 0.0;
    int v = gl_VertexID;
    vec2 px;
    if (v < 6) {
        // Two triangles (0,-1) (1,-1) (1,1) and (0,-1) (1,1) (0,1): along the segment, across it.
        float along = (v == 1 || v == 2 || v == 4) ? 1.0 : 0.0;
        float across = (v == 2 || v == 4 || v == 5) ? 1.0 : -1.0;
        px = dir * (along * (len - head)) + nrm * (across * 0.5 * u_lineWidth);
    } else if (head <= 0.0) {
        gl_Position = vec4(2.0, 2.0, 2.0, 1.0); // no head: its triangle lies outside the clip volume
        return;
    } else {
        // The arrow head: the tip and two barbs.
        float sgn = v == 7 ? 1.0 : -1.0;
        px = v == 6 ? dir * len : dir * (len - head) + nrm * (sgn * 0.5 * head);
    }
    gl_Position = vec4(p0 + px * 2.0 / u_viewport, 0.0, 1.0);
}
