// CPU twin of Backend::gdn_chunked: the gated delta rule in its chunk-parallel (WY) form, fp32.
// The formulas are in gdn_chunked.cpp and docs/DESIGN.md ("Chunked gated DeltaNet").
#pragma once
#include "backend/backend.h"

namespace qf::cpu {

// Same arguments and state blob as Backend::gdn_rows without capture (backend.h). Chunks of
// Backend::kPrefillChunk rows from row 0; a chunk's result depends only on its own rows, the
// rows before it (conv window) and the state it receives, so splitting the rows at a multiple
// of the chunk size gives bit-identical outputs and state.
void gdn_chunked(const float* mixed, const float* alpha, const float* beta_in, const float* conv_w,
                 const float* A_log, const float* dt_bias, const GdnDims& d, float* state, float* y, int M);

}  // namespace qf::cpu
