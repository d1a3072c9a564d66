// A dynamic embedding table: a hash table resource from int64 id to a row
// (the embedding and its optimizer slots, side by side), that grows as new
// ids arrive, admits an id only after it was seen `admit_after` times, and
// evicts rows unseen for a number of steps or beyond a row budget (least
// frequent first). One resource holds one shard; the pipeline routes ids to
// their shard by floor(id mod N). Its ops are in dynamic_table_ops.cc.
//
// Rows start at a deterministic function of (seed, id, column) (see
// InitialValue), so a table's contents never depend on the order ids arrive
// in or on the number of shards. tfde/ops/dynamic_store_twin.py keeps the
// same table with stock TF ops.
#ifndef TFDE_KERNELS_DYNAMIC_TABLE_H_
#define TFDE_KERNELS_DYNAMIC_TABLE_H_

#include <algorithm>
#include <memory>
#include <new>
#include <string>
#include <unordered_map>
#include <utility>
#include <limits>
#include <vector>

#include "common.h"
#include "tensorflow/core/framework/resource_mgr.h"
#include "tensorflow/core/platform/mutex.h"

namespace tfde {

using ::tensorflow::ResourceBase;
using ::tensorflow::mutex;

enum class InitKind { kZeros, kConstant, kUniform, kNormal, kTruncatedNormal };

// The initializer attribute of TfdeDynamicTableHandle.
Status ParseInitKind(const std::string& name, InitKind* kind);

// The ids of an import (an export's): each id once, as a row (`ids`) or
// as pending admission (`pending_ids`), never both. Anything else would
// give an id two states: a repeated row keeps one of two contents, and a
// pending id that also has a row is never admitted again.
Status CheckImportIds(const int64_t* ids, int64_t k, const int64_t* pending_ids, int64_t p);

struct TableSpec {
  int64_t dim = 0;
  int num_slots = 1;                  // the embedding plus optimizer slots
  std::vector<float> slot_initial;    // initial value of slots 1..num_slots-1
  InitKind init = InitKind::kZeros;
  double init_a = 0.0, init_b = 0.0;  // constant; min, max; mean, stddev
  int64_t seed = 0;
  int64_t admit_after = 1;            // sightings before an id gets a row
  bool zeros_until_admitted = false;  // else the initial value, not stored
};

// The initial embedding of `id` under `spec`, written to out[0..dim): a
// function of (seed, id, column) only (tfde/ops/reference.py's
// dynamic_initial_values computes the same with stock TF ops).
void InitialValue(const TableSpec& spec, int64_t id, float* out);

// Open addressing from id to row, linear probing, backward-shift deletion
// (no tombstones, so lookups stay short after many evictions).
class RowIndex {
 public:
  RowIndex() { Reset(16); }

  int64_t Find(int64_t id) const {
    for (uint64_t s = Slot(id);; s = (s + 1) & mask_) {
      if (rows_[s] < 0) return -1;
      if (keys_[s] == id) return rows_[s];
    }
  }

  void Insert(int64_t id, int64_t row) {
    if (2 * (size_ + 1) > static_cast<int64_t>(rows_.size())) Grow();
    uint64_t s = Slot(id);
    while (rows_[s] >= 0) s = (s + 1) & mask_;
    keys_[s] = id;
    rows_[s] = row;
    ++size_;
  }

  void Erase(int64_t id) {
    uint64_t s = Slot(id);
    while (true) {
      if (rows_[s] < 0) return;
      if (keys_[s] == id) break;
      s = (s + 1) & mask_;
    }
    // Shift later members of the probe chain back into the hole.
    uint64_t hole = s;
    for (uint64_t next = (hole + 1) & mask_; rows_[next] >= 0; next = (next + 1) & mask_) {
      const uint64_t home = Slot(keys_[next]);
      const bool movable = ((next - home) & mask_) >= ((next - hole) & mask_);
      if (movable) {
        keys_[hole] = keys_[next];
        rows_[hole] = rows_[next];
        hole = next;
      }
    }
    rows_[hole] = -1;
    --size_;
  }

  void Clear() { Reset(16); }
  int64_t size() const { return size_; }
  size_t bytes() const { return rows_.size() * (sizeof(int64_t) * 2); }

 private:
  uint64_t Slot(int64_t id) const { return MixId(static_cast<uint64_t>(id)) & mask_; }

  void Reset(int64_t capacity) {
    keys_.assign(capacity, 0);
    rows_.assign(capacity, -1);
    mask_ = capacity - 1;
    size_ = 0;
  }

  void Grow() {
    std::vector<int64_t> keys, rows;
    keys.swap(keys_);
    rows.swap(rows_);
    Reset(static_cast<int64_t>(rows.size()) * 2);
    for (size_t s = 0; s < rows.size(); ++s) {
      if (rows[s] >= 0) Insert(keys[s], rows[s]);
    }
  }

  std::vector<int64_t> keys_;
  std::vector<int64_t> rows_;
  uint64_t mask_ = 0;
  int64_t size_ = 0;
};

// Rows in fixed blocks, so growing never copies (or doubles) what is stored;
// freed rows are reused first. A block holds 4096 rows, or fewer (a power
// of two, at least one) where rows are so wide that 4096 would pass 64 MiB.
class RowStore {
 public:
  explicit RowStore(int64_t width = 1) : width_(width) {
    constexpr int kMaxBlockShift = 12;
    constexpr int64_t kMaxBlockBytes = int64_t{64} << 20;
    const int64_t row_bytes = width_ * static_cast<int64_t>(sizeof(float));
    while (block_shift_ < kMaxBlockShift &&
           (int64_t{2} << block_shift_) <= kMaxBlockBytes / row_bytes) {
      ++block_shift_;
    }
  }

  // A free row, or -1 when the memory for a new block cannot be had.
  int64_t Allocate() {
    if (!free_.empty()) {
      const int64_t row = free_.back();
      free_.pop_back();
      return row;
    }
    if (next_ == static_cast<int64_t>(blocks_.size()) << block_shift_) {
      const int64_t rows = int64_t{1} << block_shift_;
      Block block{std::unique_ptr<float[]>(new (std::nothrow) float[rows * width_]),
                  std::unique_ptr<int64_t[]>(new (std::nothrow) int64_t[rows * 3])};
      if (!block.values || !block.meta) return -1;
      blocks_.push_back(std::move(block));
    }
    return next_++;
  }
  void Free(int64_t row) { free_.push_back(row); }
  void Clear() {
    blocks_.clear();
    free_.clear();
    next_ = 0;
  }

  float* Values(int64_t row) const {
    return blocks_[row >> block_shift_].values.get() + (row & block_mask()) * width_;
  }
  // Per row: its id, how often it was seen, the step it was last seen.
  int64_t& Key(int64_t row) { return Meta(row)[0]; }
  int64_t& Count(int64_t row) { return Meta(row)[1]; }
  int64_t& LastSeen(int64_t row) { return Meta(row)[2]; }

  // Rows handed out so far, live or freed: meta of rows below it is set.
  int64_t allocated() const { return next_; }
  size_t bytes() const {
    return (blocks_.size() << block_shift_) * (width_ * sizeof(float) + 3 * sizeof(int64_t)) +
           free_.capacity() * sizeof(int64_t);
  }

 private:
  struct Block {
    std::unique_ptr<float[]> values;
    std::unique_ptr<int64_t[]> meta;
  };
  int64_t* Meta(int64_t row) {
    return blocks_[row >> block_shift_].meta.get() + (row & block_mask()) * 3;
  }
  int64_t block_mask() const { return (int64_t{1} << block_shift_) - 1; }

  int64_t width_;
  int block_shift_ = 0;
  std::vector<Block> blocks_;
  std::vector<int64_t> free_;
  int64_t next_ = 0;
};

class DynamicEmbeddingTable : public ResourceBase {
 public:
  explicit DynamicEmbeddingTable(const TableSpec& spec)
      : spec_(spec), store_(spec.dim * spec.num_slots) {}

  std::string DebugString() const override {
    return absl::StrCat("DynamicEmbeddingTable(dim=", spec_.dim, ", slots=", spec_.num_slots,
                        ")");
  }
  int64_t MemoryUsed() const override { return static_cast<int64_t>(Bytes()); }

  const TableSpec& spec() const { return spec_; }
  mutex* mu() { return &mu_; }

  // ---- under the lock (callers hold mu())

  int64_t FindRow(int64_t id) const { return index_.Find(id); }

  bool IsLiveRow(int64_t row) {
    return row >= 0 && row < store_.allocated() && index_.Find(store_.Key(row)) == row;
  }

  // Counts a sighting of `id` (`times` occurrences at `step`); *row is its
  // row, created when this sighting admits it, or -1 while not admitted.
  Status See(int64_t id, int64_t times, int64_t step, int64_t* row) {
    *row = index_.Find(id);
    if (*row >= 0) {
      store_.Count(*row) += times;
      store_.LastSeen(*row) = std::max(store_.LastSeen(*row), step);
      return absl::OkStatus();
    }
    int64_t seen = times;
    auto pending = pending_.find(id);
    if (pending != pending_.end()) seen += pending->second.count;
    if (seen < spec_.admit_after) {
      pending_[id] = Pending{seen, step};
      return absl::OkStatus();
    }
    TF_RETURN_IF_ERROR(NewRow(id, row));
    if (pending != pending_.end()) pending_.erase(pending);
    store_.Count(*row) = seen;
    store_.LastSeen(*row) = step;
    return absl::OkStatus();
  }

  // A row for `id` with the given contents (import).
  Status Restore(int64_t id, const float* values, int64_t count, int64_t last_seen) {
    if (index_.Find(id) >= 0) return InvalidArgument("id ", id, " appears twice");
    const int64_t row = store_.Allocate();
    if (row < 0) return OutOfRowMemory();
    index_.Insert(id, row);
    std::copy_n(values, spec_.dim * spec_.num_slots, store_.Values(row));
    store_.Key(row) = id;
    store_.Count(row) = count;
    store_.LastSeen(row) = last_seen;
    return absl::OkStatus();
  }
  void RestorePending(int64_t id, int64_t count, int64_t last_seen) {
    pending_[id] = Pending{count, last_seen};
  }

  void Clear() {
    index_.Clear();
    store_.Clear();
    pending_.clear();
    pending_.rehash(0);
  }

  void Remove(int64_t id, int64_t row) {
    index_.Erase(id);
    store_.Free(row);
  }

  float* Values(int64_t row) const { return store_.Values(row); }
  RowStore& store() { return store_; }
  int64_t size() const { return index_.size(); }

  // Live rows sorted by id: a deterministic order for export and eviction.
  // (id, row) of the live rows last seen after `seen_after` (all of them
  // for the lowest int64, the default), sorted by id. The filter comes
  // before the sort, so a delta of few changed rows sorts only those.
  std::vector<std::pair<int64_t, int64_t>> SortedRows(
      int64_t seen_after = std::numeric_limits<int64_t>::min()) {
    const bool all = seen_after == std::numeric_limits<int64_t>::min();
    std::vector<std::pair<int64_t, int64_t>> rows;
    if (all) rows.reserve(index_.size());
    for (int64_t r = 0; r < store_.allocated(); ++r) {
      // A freed row's id is no longer indexed to it.
      if ((all || store_.LastSeen(r) > seen_after) && index_.Find(store_.Key(r)) == r) {
        rows.emplace_back(store_.Key(r), r);
      }
    }
    std::sort(rows.begin(), rows.end());
    return rows;
  }

  struct Pending {
    int64_t count;
    int64_t last_seen;
  };
  std::vector<std::pair<int64_t, Pending>> SortedPending() const {
    std::vector<std::pair<int64_t, Pending>> out(pending_.begin(), pending_.end());
    std::sort(out.begin(), out.end(),
              [](const auto& a, const auto& b) { return a.first < b.first; });
    return out;
  }
  void ErasePending(int64_t id) { pending_.erase(id); }
  int64_t pending_size() const { return static_cast<int64_t>(pending_.size()); }

  // Removes, at `step`, the rows (and pending ids) last seen max_unseen
  // steps ago or more (if > 0), then, while more than max_rows rows remain
  // (if > 0), the least frequently seen (ties: least recently seen, then the
  // smallest id). Returns the evicted ids, sorted.
  std::vector<int64_t> Evict(int64_t step, int64_t max_unseen, int64_t max_rows);

  size_t Bytes() const {
    return sizeof(*this) + index_.bytes() + store_.bytes() +
           pending_.bucket_count() * sizeof(void*) +
           pending_.size() * (sizeof(int64_t) + sizeof(Pending) + 2 * sizeof(void*));
  }

 private:
  Status NewRow(int64_t id, int64_t* row) {
    *row = store_.Allocate();
    if (*row < 0) return OutOfRowMemory();
    index_.Insert(id, *row);
    float* values = store_.Values(*row);
    InitialValue(spec_, id, values);
    for (int s = 1; s < spec_.num_slots; ++s) {
      std::fill_n(values + s * spec_.dim, spec_.dim, spec_.slot_initial[s - 1]);
    }
    store_.Key(*row) = id;
    return absl::OkStatus();
  }

  Status OutOfRowMemory() const {
    return tensorflow::errors::ResourceExhausted("out of memory for a new row of ",
                                                 DebugString());
  }

  const TableSpec spec_;
  mutex mu_;
  RowIndex index_;
  RowStore store_;
  std::unordered_map<int64_t, Pending> pending_;
};

// The table behind input `input`, a DynamicEmbeddingTable resource handle.
inline Status LookupTable(OpKernelContext* ctx, int input,
                          tensorflow::core::RefCountPtr<DynamicEmbeddingTable>* out) {
  DynamicEmbeddingTable* table = nullptr;
  TF_RETURN_IF_ERROR(
      LookupResource(ctx, tensorflow::HandleFromInput(ctx, input), &table));
  out->reset(table);
  return absl::OkStatus();
}

}  // namespace tfde

#endif  // TFDE_KERNELS_DYNAMIC_TABLE_H_
