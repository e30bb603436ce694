// Sparse embedding rows for parameter servers (Note [Sparse embeddings]).
//
// Note [Sparse embeddings]
// Persia / ps-lite style: with ps.sparse_embedding, a worker pushes only the embedding rows
// its step's batch touched (the unique input tokens: an untied embedding's gradient is zero
// on every other row) and pulls only the rows its next step will read, plus the dense rest of
// the model both ways. A server sums the step's pushes (a row absent from a push adds zero),
// so each touched row's mean gradient equals the dense mean's, and updates with lazy AdamW:
// a row touched by any worker this step gets AdamW's update (m, v, decoupled weight decay,
// bias correction with the global step count t); an untouched row keeps its weights and both
// moments as they are (no decay, no momentum drift: TensorFlow's LazyAdam rule). The dense
// rest updates as in dense PS. A worker's copy of an untouched, unpulled row goes stale and is
// never read: before validation and after the last step it pulls the whole table.
// Row ids travel as floats (exact below 2^24 rows). Only an untied table qualifies (Llama's
// wte): GPT's wte is also the output layer, whose gradient touches every row.
#pragma once

#include <cstdint>
#include <vector>

#include "loom/model/layout.h"

namespace loom::parallel {

// The embedding table inside the flat buffer: `rows` rows of `width` floats from `offset`.
struct PsTable {  // rows == 0: no sparse table (dense PS)
  int64_t offset = 0, rows = 0, width = 0;
  bool on() const { return rows > 0; }
  FlatRange range() const { return {offset, rows * width}; }
};

// The parts of `range` outside the table (at most two), in order.
std::vector<FlatRange> dense_pieces(FlatRange range, const PsTable& t);
// The table's part of `range` (none or one piece).
std::vector<FlatRange> table_part(FlatRange range, const PsTable& t);
// The flat ranges of table rows `rows` (ascending) inside `range`, in row order.
std::vector<FlatRange> row_pieces(const std::vector<int32_t>& rows, FlatRange range, const PsTable& t);
// The rows (ascending) with a float inside `range`.
std::vector<int32_t> rows_within(const std::vector<int32_t>& rows, FlatRange range, const PsTable& t);
int64_t floats_of(const std::vector<FlatRange>& ranges);
// Copies the ranges of `flat` one after another to `out`; returns the floats copied.
int64_t gather_ranges(const float* flat, const std::vector<FlatRange>& ranges, float* out);
// The inverse: packed `in` back to the ranges of `flat`.
int64_t scatter_ranges(const float* in, const std::vector<FlatRange>& ranges, float* flat);

// The unique rows a step reads, ascending: add every micro-batch's input tokens, then take.
class RowSet {
 public:
  explicit RowSet(int64_t rows) : seen_(size_t(rows), 0) {}
  void add(const int32_t* tokens, int64_t n);
  std::vector<int32_t> take();  // and clears

 private:
  std::vector<char> seen_;
  std::vector<int32_t> list_;
};

}  // namespace loom::parallel
