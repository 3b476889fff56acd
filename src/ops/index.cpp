// The index op family table; the ops live in src/ops/index_*.cpp.
#include <vector>

#include "ops/shape_util.h"

namespace kiln {

std::span<const OpDef> index_ops() {
  static const std::vector<OpDef> table = [] {
    std::vector<OpDef> t;
    for (auto f : {shape_detail::gather_ops, shape_detail::sort_ops, shape_detail::scan_ops})
      for (const OpDef& d : f()) t.push_back(d);
    return t;
  }();
  return table;
}

}  // namespace kiln
