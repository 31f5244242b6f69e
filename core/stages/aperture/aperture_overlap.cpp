// The overlap functions are inline in aperture_overlap.hpp (shared with the CUDA kernels); this unit
// only checks that the header stands alone.
#include "core/stages/aperture/aperture_overlap.hpp"
