#include "ops/batch.h"

#include <algorithm>

#include "core/check.h"

namespace kiln::ops {

std::pair<BatchMeta, BatchMeta> split_rows(const BatchMeta& b, int32_t cut) {
  const int32_t n = b.n_tokens(), n_seqs = b.n_seqs();
  KILN_CHECK(cut > 0 && cut < n) << "split_rows: cut " << cut << " of " << n << " rows";
  KILN_CHECK(b.state_slots.empty() && b.state_snapshots.empty() && b.input_rows.empty() &&
             b.device_token_rows.empty())
      << "split_rows: a batch with recurrent state, MTP inputs or device token ids stays whole";
  std::pair<BatchMeta, BatchMeta> out;
  BatchMeta* parts[2] = {&out.first, &out.second};
  const int32_t begin[2] = {0, cut}, end[2] = {cut, n};
  const size_t w = size_t(b.max_blocks_per_seq);
  for (int p = 0; p < 2; ++p) {
    BatchMeta& m = *parts[p];
    m.block_size = b.block_size;
    m.max_blocks_per_seq = b.max_blocks_per_seq;
    m.positions.assign(b.positions.begin() + begin[p], b.positions.begin() + end[p]);
    m.slot_mapping.assign(b.slot_mapping.begin() + begin[p], b.slot_mapping.begin() + end[p]);
    m.q_start.push_back(0);
    for (int32_t s = 0; s < n_seqs; ++s) {
      const int32_t lo = std::max(b.q_start[size_t(s)], begin[p]), hi = std::min(b.q_start[size_t(s) + 1], end[p]);
      if (lo >= hi) continue;
      // The keys after this part's last row are not in the cache yet (the second part's).
      m.context_len.push_back(b.context_len[size_t(s)] - (b.q_start[size_t(s) + 1] - hi));
      m.q_start.push_back(hi - begin[p]);
      m.block_table.insert(m.block_table.end(), b.block_table.begin() + long(size_t(s) * w),
                           b.block_table.begin() + long(size_t(s + 1) * w));
    }
  }
  return out;
}

}  // namespace kiln::ops
