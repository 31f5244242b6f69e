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
out vec4 v_color;
const vec2 kQuad[6] = vec2[6](vec2(0.0, -1.0), vec2(1.0, -1.0), vec2(1.0, 1.0),
                              vec2(0.0, -1.0), vec2(1.0, 1.0), vec2(0.0, 1.0));
void main() {
    v_color = i_rgba;
    vec2 p0 = (i_seg.xy - u_center) * u_scale;
    vec2 dpx = i_seg.zw * u_scale * u_viewport * 0.5;
    float len = length(dpx);
    vec2 dir = len > 0.0 ? dpx / len : vec2(1.0, 0.0);
    vec2 nrm = vec2(-dir.y, dir.x);
    float head = u_headPx > 0.0 ? min(u_headPx, 0.5 * len) : 0.0;
    int v = gl_VertexID;
    vec2 px;
    if (v < 6) {
        vec2 q = kQuad[v];
        px = dir * (q.x * (len - head)) + nrm * (q.y * 0.5 * u_lineWidth);
    } else if (head <= 0.0) {
        px = vec2(0.0);
    } else if (v == 6) {
        px = dir * len;
    } else {
        float sgn = (v == 7) ? 1.0 : -1.0;
        px = dir * (len - head) + nrm * (sgn * 0.5 * head);
    }
    gl_Position = vec4(p0 + px * 2.0 / u_viewport, 0.0, 1.0);
}
