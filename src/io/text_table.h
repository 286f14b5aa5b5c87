// One plain-text table printer for the commands that print tables (capacity,
// calibrate's summary, eval compare, eval kvstats; issue 15 hygiene). Each
// column has a header, a minimum width and an alignment; a column widens to
// its longest cell, so a long value never shifts the columns after it.
// Cells are preformatted strings (the caller picks the number format). A row
// may have fewer cells than there are columns, and a suffix printed after
// its last cell.
#pragma once
#include <fmt/format.h>

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

namespace fp8kv {

class TextTable {
 public:
  enum class Align { left, right };
  struct Column {
    std::string header;
    size_t min_width = 0;
    Align align = Align::right;
  };
  // indent: printed before every line; sep: between cells.
  explicit TextTable(std::vector<Column> columns, std::string indent = "", std::string sep = " ")
      : cols_(std::move(columns)), indent_(std::move(indent)), sep_(std::move(sep)) {}

  void add_row(std::vector<std::string> cells, std::string suffix = "") {
    rows_.push_back(Row{std::move(cells), std::move(suffix)});
  }

  std::string str() const {
    std::vector<size_t> w(cols_.size());
    for (size_t c = 0; c < cols_.size(); ++c) w[c] = std::max(cols_[c].min_width, cols_[c].header.size());
    for (const Row& r : rows_)
      for (size_t c = 0; c < r.cells.size() && c < cols_.size(); ++c) w[c] = std::max(w[c], r.cells[c].size());
    std::vector<std::string> header;
    for (const Column& col : cols_) header.push_back(col.header);
    std::string out = line(header, w, "");
    for (const Row& r : rows_) out += line(r.cells, w, r.suffix);
    return out;
  }

 private:
  struct Row {
    std::vector<std::string> cells;
    std::string suffix;
  };
  std::string line(const std::vector<std::string>& cells, const std::vector<size_t>& w,
                   const std::string& suffix) const {
    std::string s = indent_;
    for (size_t c = 0; c < cells.size() && c < cols_.size(); ++c) {
      if (c > 0) s += sep_;
      s += cols_[c].align == Align::left ? fmt::format("{:<{}}", cells[c], w[c]) : fmt::format("{:>{}}", cells[c], w[c]);
    }
    return s + suffix + "\n";
  }
  std::vector<Column> cols_;
  std::string indent_, sep_;
  std::vector<Row> rows_;
};

}  // namespace fp8kv
