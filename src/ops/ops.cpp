// The ops layer is contracts; this file holds the few helpers they share.
#include "ops/backend.h"

#include "core/check.h"

namespace kiln::ops {

std::span<const int32_t> embedding_ids(const EmbeddingArgs& a) {
  if (a.from_batch == BatchIds::kNone) {
    KILN_CHECK(a.ids.dtype == DType::kI32 && a.ids.device == Device::kHost && a.ids.rank() == 1)
        << "embedding: ids must be a host i32 vector, got " << dtype_name(a.ids.dtype) << " " << a.ids.shape;
    return {a.ids.as<int32_t>(), size_t(a.ids.dim(0))};
  }
  KILN_CHECK(a.batch != nullptr) << "embedding: ids from the batch, but no batch";
  return a.from_batch == BatchIds::kTokens ? std::span<const int32_t>(a.batch->token_ids)
                                           : std::span<const int32_t>(a.batch->logit_rows);
}

}  // namespace kiln::ops
