// Host-side launchers of the CUDA backend's kernels. Activations are bf16
// [rows, cols] row-major; matrices (rank >= 2 weights) are bf16 on the device;
// vectors (norm weights, biases, sinks, correction biases) are fp32 (the
// upload rule of cuda_backend.cpp). Every launcher queues work on `stream` and
// checks the launch.
#pragma once

#include <cstddef>
#include <cstdint>

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "backends/cuda/kernels/quant_layout.h"

namespace kiln::cuda {

using bf16 = __nv_bfloat16;

// The step's batch metadata on the device (see ops::BatchMeta).
struct DeviceBatch {
  const int32_t* positions = nullptr;     // [n_tokens]
  const int32_t* slot_mapping = nullptr;  // [n_tokens]
  const int32_t* seq_of_token = nullptr;  // [n_tokens]
  const int32_t* block_table = nullptr;   // [n_seqs, max_blocks]
  const int32_t* token_ids = nullptr;     // [n_tokens]
  const int32_t* logit_rows = nullptr;    // [n_logit_rows]
  int32_t n_tokens = 0, n_seqs = 0, max_blocks = 0, block_size = 0, n_logit_rows = 0;
  const int32_t* q_start = nullptr;       // [n_seqs + 1]
  const int32_t* state_slots = nullptr;   // [n_seqs], or nullptr when the batch has none
  const int32_t* state_snapshots = nullptr;  // [n_tokens] (ops::BatchMeta), or nullptr when none
  const int32_t* input_rows = nullptr;       // [n_tokens] (ops::BatchMeta), or nullptr when none
};

// ---- elementwise.cu
// Whether this build has a kernel image the current device can run (cudaSuccess),
// e.g. cudaErrorNoKernelImageForDevice when its architecture was not compiled.
cudaError_t probe_kernel_image();
// out[r] = table[ids[r] - id_begin] for ids in [id_begin, id_begin + table_rows), else a
// zero row (vocab-parallel tables: another rank holds that id). ids: device memory.
void launch_embedding(const bf16* table, const int32_t* ids, int64_t n_rows, int64_t d, int64_t id_begin,
                      int64_t table_rows, bf16* out, cudaStream_t stream);
// dst[i] = src[at[i]] where at[i] >= 0, for i < n (ops::BatchMeta::device_token_rows).
void launch_patch_ids(int32_t* dst, const int32_t* at, const int32_t* src, int64_t n, cudaStream_t stream);
void launch_add(const bf16* a, const bf16* b, bf16* out, int64_t n, cudaStream_t stream);
void launch_add_bias(bf16* y, const float* bias, int64_t rows, int64_t cols, cudaStream_t stream);
// y[r, c] += bias[c] in fp32.
void launch_add_bias_f32(float* y, const float* bias, int64_t rows, int64_t cols, cudaStream_t stream);
// out = bf16(y + bias): one rounding, as a fused GEMM epilogue would.
void launch_bias_round(const float* y, const float* bias, bf16* out, int64_t rows, int64_t cols, cudaStream_t stream);
// dst[r, dst_col_begin + j] = src[r, col_begin + j] for j < n_cols (rows of n_src / n_dst).
void launch_slice_columns(const bf16* src, int64_t n_src, int64_t col_begin, bf16* dst, int64_t n_dst,
                          int64_t dst_col_begin, int64_t n_cols, int64_t rows, cudaStream_t stream);
// One product of adjacent linears [rows, n_all] (bf16, or fp32 where a part has a bias)
// handed out by columns: part i takes the next parts[i].n columns (a multiple of 8) into
// its own [rows, n] output, its bias added in fp32 and rounded once (as
// launch_bias_round). A dependent launch (pdl.cuh).
struct ColumnPart {
  bf16* out = nullptr;
  const float* bias = nullptr;
  int64_t n = 0;
};
constexpr int kMaxColumnParts = 3;
void launch_split_columns(const void* y, bool f32, int64_t n_all, const ColumnPart* parts, int n_parts, int64_t rows,
                          cudaStream_t stream);
// kind 0: silu(gate) * up; kind 1: gpt-oss clamped SwiGLU.
void launch_glu(const bf16* gate, const bf16* up, bf16* out, int64_t n, int kind, float alpha, float limit,
                cudaStream_t stream);
void launch_bf16_to_f32(const bf16* in, float* out, int64_t n, cudaStream_t stream);
void launch_f32_to_bf16(const float* in, bf16* out, int64_t n, cudaStream_t stream);
// ops::FillRandomArgs on out [n] (bf16 or f32).
void launch_fill_random(void* out, bool bf16_out, int64_t n, uint64_t seed, float mean, float stddev,
                        cudaStream_t stream);

// ---- norm_rope.cu
// residual (optional) += x; out = norm(residual or x) * weight. out may alias x.
void launch_rms_norm(const bf16* x, bf16* residual, const float* weight, bf16* out, int64_t rows, int64_t dim,
                     float eps, cudaStream_t stream);
// In place on x [n_tokens, n_heads, d_head]: the first d_rot dims of each head.
// interleaved: pairs (2i, 2i+1), else (i, i + d_rot/2).
void launch_rope(bf16* x, int64_t n_tokens, int64_t n_heads, int64_t d_head, const float* inv_freq, int d_rot,
                 float attention_factor, bool interleaved, const int32_t* positions, cudaStream_t stream);
// Per-head RMSNorm (q_norm / k_norm may be null: none) then RoPE of q [n_tokens, n_q_heads,
// d_head] and k [n_tokens, n_k_heads, d_head] in place, one launch (heads up to
// kQkNormRopeMaxHead): the numbers of launch_rms_norm then launch_rope. With store.k_cache
// set, k's rows as written and v [n_tokens, n_k_heads, d_head] also go to the bf16 caches
// ([slots, n_k_heads, d_head]) at slot_mapping[t] (negative: none), as launch_store_rows would.
inline constexpr int kQkNormRopeMaxHead = 256;
struct QkStore {
  const bf16* v = nullptr;
  bf16 *k_cache = nullptr, *v_cache = nullptr;
  const int32_t* slot_mapping = nullptr;
};
void launch_qk_norm_rope(bf16* q, bf16* k, const float* q_norm, const float* k_norm, int64_t n_tokens, int n_q_heads,
                         int n_k_heads, int d_head, float eps, const float* inv_freq, int d_rot,
                         float attention_factor, bool interleaved, const int32_t* positions, const QkStore& store,
                         cudaStream_t stream);
// A set of rows to store: cache[slot_mapping[t], col_offset : col_offset + row_elems] = x[t]
// (x: [n_tokens, row_elems], cache rows of cache_row_elems).
struct StoreRowSet {
  const bf16* x = nullptr;
  bf16* cache = nullptr;
  int64_t row_elems = 0, col_offset = 0;
};
// n_sets (1 or 2) sets in one launch: k and v, or a latent and its rotary key.
void launch_store_rows(const StoreRowSet* sets, int n_sets, const int32_t* slot_mapping, int64_t n_tokens,
                       int64_t cache_row_elems, cudaStream_t stream);
// The e4m3 cache's store (ops/kv_quant.h): x [n_tokens, n_groups * group_elems] as n_groups
// rows per token, each quantized with its own scale; group g of token t goes to
// cache[slot, col_offset + g * group_elems ..] (cache rows of cache_row_elems codes) and its
// scale to scales[slot * scales_per_slot + scale_offset + g].
void launch_store_rows_e4m3(const bf16* x, uint8_t* cache, float* scales, const int32_t* slot_mapping,
                            int64_t n_tokens, int n_groups, int64_t group_elems, int64_t cache_row_elems,
                            int64_t col_offset, int scales_per_slot, int scale_offset, cudaStream_t stream);

// ---- attention.cu, attention_fa2.cu, attention_decode.cu
// The paged KV cache as the attention kernels read it (ops::AttentionArgs): bf16, or
// e4m3 codes with one fp32 scale per (slot, kv head) row (ops/kv_quant.h). Every path
// has both instances (the kernels are templated on the cache element type).
struct KvCacheView {
  const void* k = nullptr;         // [n_blocks, block_size, n_kv_heads, d_head] bf16 or e4m3
  const void* v = nullptr;
  const float* k_scale = nullptr;  // e4m3: [n_blocks, block_size, n_kv_heads]; bf16: nullptr
  const float* v_scale = nullptr;
  bool fp8 = false;
};
// Paged causal attention (ops::AttentionArgs). sinks: [n_heads] fp32 or nullptr.
// Three paths compute it:
//   kWarp:    one warp per (token, head), no shared memory: the reference path;
//   kFa2:     FlashAttention-2 tiles on mma.sync (prefill and mixed batches);
//   kSplitKv: split-KV flash-decoding on mma.sync, with a combine kernel (decode).
enum class AttentionPath { kAuto, kWarp, kFa2, kSplitKv };
const char* attention_path_name(AttentionPath path);
// kSplitKv when n_tokens <= 4 * n_seqs (decode steps: on average at most 4 query
// tokens per sequence; n_tokens <= n_seqs + 3 guarantees at most 4 in every
// one), else kFa2; kWarp where the tensor-core kernels have no instance (head
// size other than 64 / 128, block size not a power of two) or their shared
// memory (for the cache's element type) exceeds smem_cap. Every path is exact for
// every batch: the kernels tile each sequence's own rows, so the rule only picks
// the faster one.
AttentionPath choose_attention_path(const DeviceBatch& b, int d_head, int smem_cap, bool fp8_cache = false);

struct AttentionOptions {
  AttentionPath path = AttentionPath::kAuto;
  int n_splits = 0;         // kSplitKv: KV splits per row tile; 0: from the SM count and context bound
  int fa2_variant = -1;     // kFa2: tile variant (attention_fa2.cu's table); -1: the default
  void* scratch = nullptr;  // attention_scratch_bytes(...) device bytes, free in stream order until
                            // the launch completes; nullptr: cudaMallocAsync / cudaFreeAsync on the stream
};
// smem_cap: the backend's --smem-cap; no path requests more dynamic shared
// memory per block than it.
void launch_attention(const bf16* q, const KvCacheView& kv, bf16* out, const float* sinks, const DeviceBatch& b,
                      int n_heads, int n_kv_heads, int d_head, float scale, int sliding_window, cudaStream_t stream,
                      int smem_cap = 101376, const AttentionOptions& options = {});
// Scratch the same call of launch_attention uses (0 for the warp path).
size_t attention_scratch_bytes(const DeviceBatch& b, int n_heads, int n_kv_heads, int d_head, int sliding_window,
                               int smem_cap, bool fp8_cache, const AttentionOptions& options = {});

// The tensor-core paths (launch_attention checks support and provides scratch).
// Dynamic shared memory per block; 0: no kernel for d_head.
int attention_fa2_variant_count();
int attention_fa2_smem_bytes(int d_head, int variant = -1, bool fp8_cache = false);
int attention_decode_smem_bytes(int d_head, bool fp8_cache = false);
size_t attention_fa2_scratch_bytes(const DeviceBatch& b, int n_heads, int n_kv_heads, int d_head, int variant);
size_t attention_decode_scratch_bytes(const DeviceBatch& b, int n_heads, int n_kv_heads, int d_head,
                                      int sliding_window, int n_splits, bool fp8_cache);
void launch_attention_fa2(const bf16* q, const KvCacheView& kv, bf16* out, const float* sinks, const DeviceBatch& b,
                          int n_heads, int n_kv_heads, int d_head, float scale, int sliding_window, int variant,
                          void* scratch, cudaStream_t stream);
void launch_attention_decode(const bf16* q, const KvCacheView& kv, bf16* out, const float* sinks,
                             const DeviceBatch& b, int n_heads, int n_kv_heads, int d_head, float scale,
                             int sliding_window, int n_splits, void* scratch, cudaStream_t stream);
// The MLA latent cache as its kernels read it: bf16, or e4m3 codes with two fp32 scales
// per slot (latent, rope; ops/kv_quant.h).
struct MlaCacheView {
  const void* data = nullptr;    // [n_blocks, block_size, d_latent + d_rope] bf16 or e4m3
  const float* scale = nullptr;  // e4m3: [n_blocks, block_size, 2]; bf16: nullptr
  bool fp8 = false;
};
// MLA, absorbed (ops::MlaArgs): q_lat = W_uk^T q_nope; attend over the latent cache; out = W_uv o_lat.
// kv_b: [n_heads * (d_nope + d_v), d_latent] bf16. The attend step has two paths:
//   kWarp: one warp per (token, head), fp32 (attention.cu): the reference path;
//   kMma:  16 heads per CTA on mma.sync, split-KV (attention_mla.cu), for
//          d_latent 512 + d_rope 64 (DeepSeek-V3, Kimi K2).
// Both read a bf16 or an e4m3 cache.
enum class MlaPath { kAuto, kWarp, kMma };
const char* mla_path_name(MlaPath path);
bool mla_mma_supported(int d_latent, int d_rope);
int mla_mma_smem_bytes(bool fp8_cache = false);
// DeepSeek sparse attention (ops::MlaArgs::selected): token t attends to the positions
// list[t * top_k + i], i < count[t] (launch_dsa_compact makes them from a selection), in
// that order, instead of 0..p. list == nullptr: dense.
struct MlaSelection {
  const int32_t* list = nullptr;   // [n_tokens, top_k]
  const int32_t* count = nullptr;  // [n_tokens], each >= 1
  int top_k = 0;
};
// Scratch of the kMma path's split partials (0 when it does not split); sparse_top_k:
// the selection's top_k when sparse (it bounds the keys per row), else 0.
size_t mla_mma_scratch_floats(const DeviceBatch& b, int n_heads, int sparse_top_k = 0);
// scratch: n_tokens * n_heads * d_latent * 2 floats, then (kMma) mla_mma_scratch_floats.
void launch_mla(const bf16* q_nope, const bf16* q_rope, const MlaCacheView& cache, const bf16* kv_b, bf16* out,
                float* scratch, const DeviceBatch& b, int n_heads, int d_nope, int d_rope, int d_v, int d_latent,
                float scale, MlaPath path, cudaStream_t stream, const MlaSelection& sel = {});
// The kMma attend step: o_lat [n_tokens, n_heads, 512] fp32 from q_lat (fp32) and q_rope.
void launch_mla_attend_mma(const float* q_lat, const bf16* q_rope, const MlaCacheView& cache, float* o_lat,
                           float* partials, const DeviceBatch& b, int n_heads, float scale, cudaStream_t stream,
                           const MlaSelection& sel = {});

// ---- dsa.cu: DeepSeek sparse attention (ops::LayerNormArgs, DsaSelectArgs, MlaArgs::selected)
// out = LayerNorm(x) * weight + bias per row (fp32 math; bias may be null; out may alias x).
void launch_layer_norm(const bf16* x, const float* weight, const float* bias, bf16* out, int64_t rows, int64_t dim,
                       float eps, cudaStream_t stream);
// The indexer's key cache: bf16, or e4m3 codes with one fp32 scale per slot.
struct DsaIndexCacheView {
  const void* data = nullptr;    // [n_blocks, block_size, d_index] bf16 or e4m3
  const float* scale = nullptr;  // e4m3: [n_blocks, block_size]; bf16: nullptr
  bool fp8 = false;
};
// Dynamic shared memory of the scores kernel (launch_dsa_select refuses above smem_cap).
int dsa_score_smem_bytes(int n_heads, int d_index);
// How launch_dsa_select splits a batch: `chunk` tokens at a time, each token's top-k
// over `parts` CTAs, and the uint32 scratch it needs (per chunk token the context
// capacity max_blocks * block_size of score keys, plus the top-k's histograms and
// counts), all fixed for a batch shape.
struct DsaSelectPlan {
  int chunk = 0, parts = 0;
  size_t scratch_words = 0;
};
DsaSelectPlan dsa_select_plan(const DeviceBatch& b);
// ops::DsaSelectArgs: selected [n_tokens, top_k] i32 on the device; q [n_tokens, n_heads,
// d_index], weights [n_tokens, n_heads]; scratch: dsa_select_plan(b).scratch_words.
void launch_dsa_select(const bf16* q, const bf16* weights, const DsaIndexCacheView& cache, int32_t* selected,
                       uint32_t* scratch, const DeviceBatch& b, int n_heads, int d_index, int top_k, float scale,
                       float weight_scale, int smem_cap, cudaStream_t stream);
// list [n_tokens, top_k], count [n_tokens]: per token the entries j of selected[t, :] with
// 0 <= j <= p, in their order (-1 and out-of-range entries dropped). A row without any
// (never one dsa_select makes) attends to its own position p.
void launch_dsa_compact(const int32_t* selected, int top_k, const DeviceBatch& b, int32_t* list, int32_t* count,
                        cudaStream_t stream);

// ---- moe.cu
struct MoeRouting {
  int kind = 0;  // ops::RouterKind as int
  int n_experts = 0, top_k = 0, n_group = 1, topk_group = 1;
  bool norm_topk_prob = false;
  float routed_scaling_factor = 1.0f;
  // Expert parallelism (ops::MoeExperts::first_expert): this rank holds experts
  // [first_local, first_local + n_local); n_local 0: all n_experts.
  int first_local = 0, n_local = 0;
};
// logits [n_tokens, n_experts] fp32 -> experts / weights [n_tokens, top_k]. Routing runs
// over all n_experts; the experts written are local indices (global - first_local), and
// a pair whose expert this rank does not hold is written as expert -1, weight 0: every
// kernel below skips it (the MoE kernels read no weight for it, the combine adds nothing).
void launch_route(const float* logits, const float* correction_bias, const MoeRouting& r, int64_t n_tokens,
                  int32_t* experts, float* weights, cudaStream_t stream);
// logits[t, e] = x[t] . router[e] (+ bias[e]), fp32, for decode-shaped calls: a block per
// expert up to 8 tokens (d_model a multiple of 8, at most 8192), else a warp per logit;
// prefill-shaped ones take cuBLASLt (CudaBackend::moe).
void launch_router_logits(const bf16* x, const bf16* router, const float* bias, int64_t n_tokens, int64_t n_experts,
                          int64_t d_model, float* logits, cudaStream_t stream);

// One expert's weights on the device (a table of these is passed to the kernel).
struct ExpertWeights {
  const bf16* gate_up = nullptr;  // fused [2*d_ff, d_model] (rows gate..up or interleaved) or nullptr
  const bf16* gate = nullptr;     // [d_ff, d_model] when not fused
  const bf16* up = nullptr;
  const bf16* down = nullptr;     // [d_model, d_ff]
  const float* gate_up_bias = nullptr;  // [2*d_ff] or nullptr
  const float* down_bias = nullptr;     // [d_model] or nullptr
};
struct MoeShape {
  int64_t d_model = 0, d_ff = 0;
  bool interleaved = false;  // fused gate_up rows alternate gate, up
  bool transposed = false;   // weights stored input-major (gpt-oss bf16)
  int glu_kind = 0;
  float alpha = 1.702f, limit = 7.0f;
};
// The expert lists below hold local indices into the expert table (n_experts: its
// length), or -1 for a pair another rank computes (launch_route).
// Two ways to compute the experts (see moe_gemm.cu for the grouped GEMMs):
//   kGemv:    one block per (token, chosen expert), matrix-vector products: the
//             reference path, every layout, needs (d_model + d_ff) * 4 bytes of smem;
//   kGrouped: pairs sorted by expert, tiled mma.sync GEMMs with the GLU fused.
// kGemv: expert_mlp_kernel (any layout); kGrouped: the tiled GEMMs (moe_gemm.cu);
// kStreamGemv: quant_gemv.cu's kernel over bf16 row-major experts (kQuantValueBf16).
enum class MoePath { kAuto, kGemv, kGrouped, kStreamGemv };
const char* moe_path_name(MoePath path);
// Whether the grouped GEMMs take this layout (dims multiples of 8; input-major
// weights only as interleaved fused gate_up) and expert count.
bool moe_grouped_supported(const MoeShape& s, bool fused_gate_up, int n_experts);
int moe_grouped_smem_bytes();
int moe_gemv_smem_bytes(const MoeShape& s);
// The grouped path's tile rows for a batch of n_pairs = n_tokens * top_k pairs,
// and the tile-table entries (the GEMM grids' x) it needs.
int moe_grouped_bm(int64_t n_pairs, int n_experts);
int moe_tile_slots(int64_t n_pairs, int n_experts, int bm);
struct MoeGroupedScratch {
  int32_t* perm = nullptr;  // [n_pairs]
  int4* tiles = nullptr;    // [moe_tile_slots(n_pairs, n_experts, moe_grouped_bm(...))]
  bf16* act = nullptr;      // [n_pairs, d_ff]
  float* y = nullptr;       // [n_pairs, d_model]
};
// y[pair] = down_e(glu(gate_e x, up_e x)) (+ biases) for every (token, slot)
// pair, unweighted: what launch_moe_combine sums.
void launch_moe_grouped(const bf16* x, const ExpertWeights* expert_table, const int32_t* experts,
                        const MoeShape& s, int64_t n_pairs, int n_experts, int top_k, MoeGroupedScratch& scratch,
                        cudaStream_t stream);
// The GEMV path's y[pair] (scratch: n_tokens * top_k * d_model floats).
void launch_moe_gemv(const bf16* x, const ExpertWeights* expert_table, const int32_t* experts, const MoeShape& s,
                     int64_t n_tokens, int top_k, float* y, int smem_cap, cudaStream_t stream);
// out[t] = sum over t's pairs in ascending expert id of weight * y[pair] (pairs of expert
// -1 skipped; a token with none gets zeros).
void launch_moe_combine(const float* y, const int32_t* experts, const float* weights, int64_t n_tokens, int top_k,
                        int64_t d_model, bf16* out, cudaStream_t stream);

// Sorts the (token, slot) pairs by expert into perm and cuts each expert's rows into
// tiles of bm rows (n_slots entries, unused ones expert -1): moe_gemm.cu's tile table.
// Pairs of expert -1 get no row.
inline constexpr int kMoeAlignMaxExperts = 1024;
void launch_moe_align(const int32_t* experts, int64_t n_pairs, int n_experts, int bm, int32_t* perm, int4* tiles,
                      int n_slots, cudaStream_t stream);
// launch_route, then launch_moe_align over its experts (n_experts: the local table's),
// as one launch of one block: a decode step of at most kRouteAlignMaxTokens tokens waits
// for one kernel less before its first expert weights are read. One token takes a kernel
// of its own (a thread per expert, the top-k by ranks; the same bits as the two kernels).
inline constexpr int kRouteAlignMaxTokens = 16;
void launch_route_align(const float* logits, const float* correction_bias, const MoeRouting& r, int64_t n_tokens,
                        int32_t* experts, float* weights, int n_experts, int bm, int32_t* perm, int4* tiles,
                        int n_slots, cudaStream_t stream);

// ---- quant_gemm.cu: GEMMs over quantized weights in the packed layout of
// backends/cuda/quant_pack.h (FP8, MXFP4, NVFP4, INT4), bf16 activations.
struct QuantMat {
  const uint8_t* codes = nullptr;   // [rows, code row bytes], unit-major (quant_layout.h)
  const uint8_t* scales = nullptr;  // [rows, scale row bytes], unit-major
  const float* scale2 = nullptr;    // NVFP4's global scale (device), or nullptr
};
// What every matrix of one GEMM shares.
struct QuantFormat {
  int value = 0;       // how a code becomes a number: 0 e2m1, 1 int4 (code - 8), 2 e4m3
  int scale_kind = 0;  // 0 e8m0, 1 e4m3, 2 bf16, 3 f16, 4 f32
  int scale_bytes = 1;
  int group = 32;      // inputs per scale
  // Packed row bytes of a weight with k inputs (quant_pack.h: padded to 128-input tiles).
  __host__ __device__ int64_t k_padded(int64_t k) const { return (k + 127) / 128 * 128; }
  __host__ __device__ int64_t code_row_bytes(int64_t k) const { return k_padded(k) * (value == 2 ? 8 : 4) / 8; }
  __host__ __device__ int64_t scale_row_bytes(int64_t k) const { return k_padded(k) / group * scale_bytes; }
  // A row's bytes per 128-input block (quant_layout.h's blk): codes, scales.
  __host__ __device__ int code_block_bytes() const { return value == 2 ? 128 : 64; }
  __host__ __device__ int tile_scale_bytes() const { return 128 / group * scale_bytes; }
};
// QuantFormat::value of plain bf16 weights, which only the GEMV (quant_gemv.cu) takes:
// a QuantMat's codes are then the bf16 rows [n_out, n_in] (unpadded), without scales.
inline constexpr int kQuantValueBf16 = 3;
inline constexpr QuantFormat kBf16GemvFormat{.value = kQuantValueBf16, .scale_kind = 0, .scale_bytes = 0, .group = 128};
struct QuantExpert {
  QuantMat gate_up, gate, up, down;     // gate_up.codes == nullptr: separate gate and up
  const float* gate_up_bias = nullptr;  // [2*d_ff] or nullptr
  const float* down_bias = nullptr;     // [d_model] or nullptr
};
// The quantized GEMM's tile shapes (quant_gemm.cu): 16, 64 or 128 rows per tile.
enum class QTile { kDecode, kPrefill, kWide };
// The tile shape for a weight of format f multiplied by this many rows (a dense
// linear's rows); quant_moe_tile: a MoE layer's n_pairs over
// n_experts (never fewer rows per tile than moe_grouped_bm's, whose tile table the
// scratch is sized for); rows of each shape's tiles. The heuristics a tuner replaces.
QTile quant_gemm_tile(int64_t rows_per_weight, const QuantFormat& f);
QTile quant_moe_tile(int64_t n_pairs, int n_experts, const QuantFormat& f);
int quant_gemm_tile_rows(QTile t);
// Whether rows_per_group rows per weight take the decode-shaped (16-row) tiles.
bool quant_gemm_decode_rows(int64_t rows_per_group);
int quant_gemm_smem_bytes();
// out [rows, n_out] = bf16(x [rows, n_in] W^T * scale2 + bias); n_in % 8 == 0. Decode-
// shaped tiles whose grid would leave SMs idle split K over k_splits CTAs each
// (quant_linear_k_splits), their fp32 sums in split_scratch (k_splits x rows x n_out
// floats) added in split order by a second kernel.
int quant_linear_k_splits(int64_t rows, int64_t n_out, int64_t n_in, const QuantFormat& f);
void launch_quant_linear(const bf16* x, const QuantMat& w, const QuantFormat& f, const float* bias, int64_t rows,
                         int64_t n_out, int64_t n_in, bf16* out, cudaStream_t stream, int k_splits = 1,
                         float* split_scratch = nullptr);
// launch_moe_grouped over quantized experts (same scratch, same y).
void launch_moe_grouped_quant(const bf16* x, const QuantExpert* table, const QuantFormat& f, const int32_t* experts,
                              const MoeShape& s, int64_t n_pairs, int n_experts, int top_k, MoeGroupedScratch& scratch,
                              cudaStream_t stream);
// W8A8 (FP8 weights with an fp32 scale per 128 inputs, e4m3 activations quantized per row
// and 128 inputs by a pre-pass into act_scratch, e4m3 mma.sync): the prefill-shaped
// GEMMs for such weights on SM 8.9+ (quant_w8a8_supported says whether f and a device of
// compute capability cc, e.g. 89, qualify). act_scratch: quant_w8a8_act_bytes(rows, n_in) (dense) or
// moe_w8a8_act_bytes(s, n_pairs, top_k) device bytes.
bool quant_w8a8_supported(const QuantFormat& f, int cc);
int quant_w8a8_smem_bytes();
size_t quant_w8a8_act_bytes(int64_t rows, int64_t n_in);
size_t moe_w8a8_act_bytes(const MoeShape& s, int64_t n_pairs, int top_k);
void launch_quant_linear_w8a8(const bf16* x, const QuantMat& w, const QuantFormat& f, const float* bias, int64_t rows,
                              int64_t n_out, int64_t n_in, bf16* out, void* act_scratch, cudaStream_t stream);
// launch_moe_grouped_quant for prefill-shaped calls (moe_grouped_bm == 64).
void launch_moe_grouped_quant_w8a8(const bf16* x, const QuantExpert* table, const QuantFormat& f,
                                   const int32_t* experts, const MoeShape& s, int64_t n_pairs, int n_experts,
                                   int top_k, MoeGroupedScratch& scratch, void* act_scratch, cudaStream_t stream);
// ---- quant_gemm_sm120.cu: launch_moe_grouped_quant on SM 12.x's block-scaled tensor
// cores (sm_120a / sm_121a code only), activations quantized on the fly in the layout of
// kernels/quant_mma_sm120.h (act_format: its ActFormat, 0 e4m3 for MXFP4 weights, 1
// e2m1 for NVFP4).
// The activation format for weights of format f, or -1 when the native kernels take no
// such weights (MXFP4 and NVFP4 only).
int quant_native_act_format(const QuantFormat& f);
int quant_native_smem_bytes();
// Whether the current device is SM 12.x and runs this build's native code (a probe
// kernel, once per device): false on every other GPU, where nothing native is launched.
bool quant_sm120_native_available();
// Quantized activations of `rows` rows of k inputs, carved from one device buffer.
struct QuantActBuffers {
  uint8_t* codes = nullptr;     // [rows, act code row bytes]
  uint8_t* scales = nullptr;    // [rows, act scale row bytes]
  float* row_scale = nullptr;   // [rows] (e2m1)
};
size_t quant_act_bytes(int act_format, int64_t rows, int64_t k);
QuantActBuffers quant_act_buffers(int act_format, void* base, int64_t rows, int64_t k);
// x [rows, k] bf16 -> out (k % 8 == 0). Portable code: it runs on every GPU.
void launch_quantize_act(int act_format, const bf16* x, int64_t rows, int64_t k, const QuantActBuffers& out,
                         cudaStream_t stream);
// Device bytes of act_scratch: x quantized per token (at its start), then act per pair.
size_t moe_native_quant_scratch_bytes(int act_format, const MoeShape& s, int64_t n_pairs, int top_k);
// Whether a MoE call is prefill-shaped (moe_grouped_bm's 64-row tiles), the one shape
// the native kernels take (decode shapes stay on the GEMV and the portable tiles).
bool moe_native_quant_prefill(int64_t n_pairs, int n_experts);
// launch_moe_grouped_quant for prefill-shaped calls over MXFP4 / NVFP4 experts (scratch
// sized for 64-row tiles); refuses (KILN_CHECK) a device that is not SM 12.x or has no
// native code.
void launch_moe_grouped_quant_sm120(const bf16* x, const QuantExpert* table, const QuantFormat& f,
                                    const int32_t* experts, const MoeShape& s, int64_t n_pairs, int n_experts,
                                    int top_k, MoeGroupedScratch& scratch, void* act_scratch, cudaStream_t stream);
// ---- quant_gemv.cu: the decode-shaped products (at most kGemvRows activation rows per
// weight), weights streamed straight into registers and decoded for the tensor cores.
constexpr int kGemvRows = 8;
// The most activation rows the GEMV takes with n_in inputs (they are staged in shared
// memory; 0: n_in is not a multiple of 8).
int quant_gemv_max_rows(int64_t n_in);
// The warps per CTA of MoE GEMV launches staging `rows` rows of n_in inputs: 4 where an
// SM's shared memory (blocks_fit_sm) holds 4 such CTAs, else 8 where it holds 2 (16 warps
// either way), else 0 (the tile is to be cut). By shared memory alone: a launch where 4
// also takes 8 if registers leave an SM fewer warps of 4-warp CTAs (quant_gemv.cu).
int quant_gemv_moe_warps(int rows, int64_t n_in);
// Up to kGemvParts linears of one input x [rows, n_in], rows <= quant_gemv_max_rows(n_in),
// in one launch: out = bf16(x w^T + bias) for each part. The weights are packed in format
// f (launch_quant_linear's at few rows), or plain bf16 [n_out, n_in] row-major with
// f = kBf16GemvFormat (codes = the bf16 rows, n_in % 8 == 0). One part is a linear; q, k
// and v of a decode layer are one launch (k and v alone are too small to fill the GPU).
struct GemvPart {
  QuantMat w;
  const float* bias = nullptr;  // [n_out] or nullptr
  int64_t n_out = 0;
  bf16* out = nullptr;          // [rows, n_out]
};
constexpr int kGemvParts = 3;
void launch_quant_gemv_linears(const bf16* x, const GemvPart* parts, int n_parts, const QuantFormat& f, int64_t rows,
                               int64_t n_in, cudaStream_t stream);
// The same linears over plain bf16 weights at 1 to kRowGemvMaxRows rows on the CUDA cores
// (row_gemv.cu: a one-stream decode's projections, a pure stream of their weights), which
// launch_quant_gemv_linears takes for bf16 weights up to bf16_row_gemv_rows() rows
// (set_bf16_row_gemv_rows; KILN_ROW_GEMV_ROWS=n at start, 0: never).
constexpr int kRowGemvMaxRows = 4;
constexpr int kRowGemvDefaultRows = 4;
int bf16_row_gemv_rows();
void set_bf16_row_gemv_rows(int n);
void launch_bf16_row_gemv(const bf16* x, const GemvPart* parts, int n_parts, int64_t rows, int64_t n_in,
                          cudaStream_t stream);
// launch_moe_gemv_quant's two products for bf16 experts (kBf16GemvFormat) in tiles of
// 1 to kRowGemvMaxRows rows, on the CUDA cores (row_gemv.cu), which launch_moe_gemv_quant
// takes for tiles of one row (a one-stream decode step's; kiln bench op, Qwen3-30B-A3B at
// eight tokens, whose tiles moe_gemv_tile_rows makes 4 rows: 168 -> 236 us, hence one) while
// bf16_row_gemv_rows() > 0.
constexpr int kRowGemvMoeRows = 1;
void launch_moe_row_gemv(const bf16* x, const QuantExpert* table, const MoeShape& s, int top_k, int rows_cap,
                         const int32_t* perm, const int4* tiles, int n_slots, bf16* act, float* y,
                         cudaStream_t stream);
// Both MoE products over a tile table of rows_cap-row tiles (launch_moe_align with
// bm = rows_cap <= quant_gemv_max_rows of d_model and d_ff): act (sorted rows) then y
// (per pair), as launch_moe_grouped_quant. f may be kBf16GemvFormat (bf16 experts as
// QuantMats, not transposed).
void launch_moe_gemv_quant(const bf16* x, const QuantExpert* table, const QuantFormat& f, const MoeShape& s,
                           int top_k, int rows_cap, int64_t n_pairs, const int32_t* perm, const int4* tiles,
                           int n_slots, bf16* act, float* y, cudaStream_t stream);
// The units (16 weight rows) each warp of a MoE down GEMV streams in turn: n > 0 sets it
// for every later launch of the process (1: one, the plain kernel), 0 restores the rule
// (quant_gemv.cu, down_units_per_warp); KILN_GEMV_UNITS_PER_WARP=n sets it at start.
void set_quant_gemv_units_per_warp(int n);
// out [n_out, n_in] = bf16(W) (MLA's kv_b, whose attention kernels read bf16).
void launch_dequantize(const QuantMat& w, const QuantFormat& f, int64_t n_out, int64_t n_in, bf16* out,
                       cudaStream_t stream);

// ---- mma_peak.cu: the tensor cores' mma.sync rate on this device (the ceiling of
// prefill-shaped GEMMs): bf16 m16n8k16 and e4m3 m16n8k32, fp32 accumulation.
enum class MmaKind { kBf16, kE4m3 };
// Whether the current device has the instruction (e4m3: SM 8.9 and later).
bool mma_peak_supported(MmaKind kind);
// Dense TFLOP/s of back-to-back mma.sync over all SMs (best of 3 timed runs of about
// 10-50 ms each); 0 when !mma_peak_supported(kind). Synchronizes `stream`.
double measure_mma_peak_tflops(MmaKind kind, cudaStream_t stream);

// ---- gated_delta_net.cu
// ops::GatedDeltaNetArgs on the device: bf16 activations (qkv [T, qkv_cols], z [T, nv dv]
// and a [T, nv] when flat, b [T, nv] or grouped [T, 2 nv]; out [T, nv dv]), bf16
// conv_weight [channels, conv_kernel], fp32 a_log / dt_bias [nv] and norm_weight [dv];
// conv_state [n_slots, channels, conv_kernel - 1] bf16 or fp32, recurrent_state
// [n_slots, nv, dk, dv] fp32, both updated in place; batch arrays from DeviceBatch.
// x [T, channels], gb [T, 2 nv] and o [T, nv dv]: fp32 scratch of the call.
constexpr int kGdnMaxConvKernel = 8;
constexpr int kGdnMaxDk = 256;
struct GdnParams {
  const bf16 *qkv = nullptr, *z = nullptr, *b = nullptr, *a = nullptr;
  int64_t qkv_cols = 0;
  bool grouped = false;
  const bf16* conv_weight = nullptr;
  const float *a_log = nullptr, *dt_bias = nullptr, *norm_weight = nullptr;
  float norm_eps = 1e-6f;
  void* conv_state = nullptr;
  bool conv_state_bf16 = true;
  float* recurrent_state = nullptr;
  bf16* out = nullptr;
  const int32_t *positions = nullptr, *seq_of_token = nullptr, *q_start = nullptr, *state_slots = nullptr;
  // Row t's state also into state row snapshots[t] where >= 0 (speculative verify steps); or nullptr.
  const int32_t* snapshots = nullptr;
  int32_t n_tokens = 0, n_seqs = 0, nk = 0, nv = 0, dk = 0, dv = 0, conv_kernel = 0;
  float *x = nullptr, *gb = nullptr, *o = nullptr;
  // The chunked form (prefill): a sequence with at least chunk_min_tokens rows in the step
  // takes it, in chunks of kGdnChunk (INT32_MAX: none does); n_chunks is the number of
  // chunks of those sequences (gdn_chunk_count). Its fp32 scratch, per (row, value head):
  // w [dk] and u [dv] (the WY form's rows), pmat [kGdnChunk] (the chunk's masked, decayed
  // q k^T row) and gcum [1] (the cumulative log decay within the chunk).
  int32_t chunk_min_tokens = INT32_MAX, n_chunks = 0;
  float *w = nullptr, *u = nullptr, *pmat = nullptr, *gcum = nullptr;
};
constexpr int kGdnChunk = 64;
// CudaBackend's default chunk_min_tokens: one whole chunk (the op alone on an H200, Qwen3.5
// shapes, kiln bench op: 64 rows 94 us chunked vs 82 us token-serial, 512 rows 253 vs 420 us).
constexpr int32_t kGdnChunkMinTokens = 64;
constexpr int kGdnChunkMaxHead = 128;  // dk and dv of the chunked form
// Whether a step's sequence of n rows takes the chunked form, and the chunks of a step
// (q_start: the host's copy of the batch's); the launch sizes its grid from the count.
__host__ __device__ inline bool gdn_chunked(int64_t n_rows, int32_t chunk_min_tokens) {
  return n_rows >= chunk_min_tokens;
}
int32_t gdn_chunk_count(const int32_t* q_start, int32_t n_seqs, int32_t chunk_min_tokens);
// The larger shared memory of the two chunked kernels for key heads of dk (85,504 and
// 76,800 bytes at 128). The form needs dk and dv at most kGdnChunkMaxHead, multiples of 4.
int64_t gdn_chunk_smem_bytes(int dk);
void launch_gated_delta_net(const GdnParams& p, cudaStream_t stream);
// out = x * sigmoid(gate) (ops::SigmoidMulArgs): x, out [rows, n], gate [rows, gate_cols]
// with gate_cols n or 1 (broadcast); out may alias x.
void launch_sigmoid_mul(const bf16* x, const bf16* gate, bf16* out, int64_t rows, int64_t n, int64_t gate_cols,
                        cudaStream_t stream);

// ---- sampling.cu
constexpr int kSampleMaxTop = 20;  // ops::kMaxTopLogprobs
// One row's ops::SamplingParams and its draw.
struct SampleRow {
  float temperature = 0.0f;  // <= 0: greedy
  int32_t top_k = 0;         // 0: off
  float top_p = 1.0f;        // 1: off
  float min_p = 0.0f;        // 0: off
  float uniform = 0.0f;      // in [0, 1)
};
// ops::SampleArgs on logits [n_rows, vocab] bf16, no sort (a radix select over the logit's
// 16-bit key; 29,744 bytes of static shared memory a block, no dynamic), a row on
// sample_cluster_size(n_rows, vocab) blocks. rows: [n_rows]; outputs tokens [n_rows],
// logprobs [n_rows] or nullptr, top_ids / top_logprobs [n_rows, n_top]: all device
// memory. vocab <= 2^24, n_top <= kSampleMaxTop.
void launch_sample(const bf16* logits, int64_t n_rows, int64_t vocab, const SampleRow* rows, int n_top,
                   int32_t* tokens, float* logprobs, int32_t* top_ids, float* top_logprobs, cudaStream_t stream);
// Blocks a row of launch_sample takes on the current device: a thread-block cluster of up
// to 8 on SM 9.0+ while rows * blocks fit the SMs (1 before SM 9.0); KILN_SAMPLE_CLUSTER=N
// asks N (a power of two, within what fits).
int sample_cluster_size(int64_t n_rows, int64_t vocab);
// ops::PenaltyParams applied in place to logits [n_rows, vocab] bf16: one entry per
// (row, seen token), each token at most once per row (device memory).
struct PenaltyRow {
  float repetition = 1.0f, presence = 0.0f, frequency = 0.0f;
};
struct PenaltyEntry {
  int32_t row = 0, token = 0, count = 0;  // count: times generated
};
void launch_apply_penalties(bf16* logits, int64_t vocab, const PenaltyEntry* entries, int64_t n_entries,
                            const PenaltyRow* rows, cudaStream_t stream);

}  // namespace kiln::cuda
