// Stretch, limits and colormap of the float pixels. Must match viewers/stretch.cpp (stretchValue,
// colormapTable, colormapIndex), the CPU reference used by the tests.
in vec2 v_pix;
out vec4 fragColor;
uniform sampler2D u_image;  // R32F tile, unit 0
uniform isampler2D u_seg;   // R32I segmentation tile, unit 1
uniform sampler2D u_lut;    // R32F histogram-equalisation table (u_lutSize x 1), unit 2
uniform sampler2D u_cmap;   // RGBA8 colormap (256 x 1), unit 3
uniform int u_stretch;      // 0 linear, 1 log, 2 sqrt, 3 asinh, 4 histeq
uniform float u_lo;
uniform float u_hi;
uniform float u_asinhS;
uniform float u_logA;
uniform int u_lutSize;
uniform int u_hasSeg;
uniform float u_segAlpha;
uniform vec4 u_nanColor;
uniform sampler2D u_rgb;    // RGB32F colour planes of the tile (a colour composite), unit 4
uniform int u_hasRgb;       // 1: the pixels are u_rgb's, each plane with its own limits, no colormap
uniform vec3 u_loRgb;
uniform vec3 u_hiRgb;

float stretchValue(float v, float lo, float hi) {
    float t = clamp((v - lo) / (hi - lo), 0.0, 1.0);
    if (u_stretch == 1) return log(1.0 + u_logA * t) / log(1.0 + u_logA);
    if (u_stretch == 2) return sqrt(t);
    if (u_stretch == 3) return asinh(t / u_asinhS) / asinh(1.0 / u_asinhS);
    if (u_stretch == 4 && u_lutSize >= 2) {
        float pos = t * float(u_lutSize - 1);
        int i = min(int(pos), u_lutSize - 2);
        float f = pos - float(i);
        float a = texelFetch(u_lut, ivec2(i, 0), 0).r;
        float b = texelFetch(u_lut, ivec2(i + 1, 0), 0).r;
        return a + (b - a) * f;
    }
    return t;
}

vec3 segColour(int id) {
    uint h = uint(id) * 2654435761u;
    h ^= h >> 15;
    return vec3(float(h & 255u), float((h >> 8) & 255u), float((h >> 16) & 255u)) / 255.0 * 0.8 + 0.2;
}

void main() {
    ivec2 size = textureSize(u_image, 0);
    ivec2 p = clamp(ivec2(floor(v_pix)), ivec2(0), size - 1);
    float v = texelFetch(u_image, p, 0).r;
    vec4 c;
    if (u_hasRgb != 0) {
        vec3 w = texelFetch(u_rgb, p, 0).rgb;
        if (any(isnan(w)) || any(isinf(w)))
            c = u_nanColor;
        else
            c = vec4(stretchValue(w.r, u_loRgb.r, u_hiRgb.r), stretchValue(w.g, u_loRgb.g, u_hiRgb.g),
                     stretchValue(w.b, u_loRgb.b, u_hiRgb.b), 1.0);
    } else if (isnan(v) || isinf(v)) {
        c = u_nanColor;
    } else {
        float t = stretchValue(v, u_lo, u_hi);
        int idx = int(clamp(t, 0.0, 1.0) * 255.0 + 0.5);
        c = texelFetch(u_cmap, ivec2(idx, 0), 0);
    }
    if (u_hasSeg != 0) {
        int id = texelFetch(u_seg, p, 0).r;
        if (id > 0) c.rgb = mix(c.rgb, segColour(id), u_segAlpha);
    }
    fragColor = vec4(c.rgb, 1.0);
}
