// Builds every kernel launcher (*.cu) with the host compiler under the emulation harness. The
// launchers contain no `<<<>>>` (they call kernels::launch), so the same text compiles both ways.
#include "kernels/attention/attention.cu"        // NOLINT(build/include)
#include "kernels/attention/merge_partials.cu"   // NOLINT(build/include)
#include "kernels/attention/mixed_attention.cu"  // NOLINT(build/include)
#include "kernels/bench/stream_read.cu"          // NOLINT(build/include)
#include "kernels/kv_pages/copy_pieces.cu"       // NOLINT(build/include)
#include "kernels/kv_pages/kv_page_ops.cu"       // NOLINT(build/include)
#include "kernels/ops/ops.cu"                    // NOLINT(build/include)
#include "kernels/sampling/sampling.cu"          // NOLINT(build/include)
