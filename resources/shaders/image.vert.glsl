// One image tile as a quad: u_tile = (x0, y0, w, h) in image pixels (origin pixel index and size).
layout(location = 0) in vec2 a_corner; // unit quad corner, 0..1
uniform vec4 u_tile;
uniform vec2 u_center; // image coordinate at the viewport centre
uniform vec2 u_scale;  // clip units per image pixel (2 zoom / viewport size)
uniform float u_texScale; // image pixels per texel: 1, or a level-of-detail factor (u_tile still in image px)
uniform vec4 u_orient;   // row-major 2x2: image offset -> screen offset (flips, quarter turns)
vec2 orient(vec2 d) { return vec2(u_orient.x * d.x + u_orient.y * d.y, u_orient.z * d.x + u_orient.w * d.y); }
out vec2 v_pix;        // tile-local texel coordinate, 0..w / u_texScale
void main() {
    vec2 local = a_corner * u_tile.zw;
    vec2 img = u_tile.xy - 0.5 + local;
    v_pix = local / u_texScale;
    gl_Position = vec4(orient(img - u_center) * u_scale, 0.0, 1.0);
}
