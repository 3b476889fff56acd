#include "cli.h"

namespace kiln::cli {

Expected<ShapeMap> parse_shapes(const std::string& spec, const std::string& flag) {
  ShapeMap out;
  size_t start = 0;
  while (start <= spec.size()) {
    size_t end = spec.find(',', start);
    if (end == std::string::npos) end = spec.size();
    const std::string item = spec.substr(start, end - start);
    start = end + 1;
    if (item.empty()) {
      if (end == spec.size()) break;
      continue;
    }
    const size_t colon = item.rfind(':');
    if (colon == std::string::npos || colon == 0)
      return KILN_ERROR("{}: '{}' must look like name:1x3x224x224", flag, item);
    const std::string name = item.substr(0, colon);
    const std::string dims = item.substr(colon + 1);
    std::vector<int64_t> shape;
    if (!dims.empty() && dims != "scalar") {
      size_t p = 0;
      while (p <= dims.size()) {
        size_t x = dims.find('x', p);
        if (x == std::string::npos) x = dims.size();
        const std::string d = dims.substr(p, x - p);
        if (d.empty() || d.find_first_not_of("0123456789") != std::string::npos || d.size() > 12)
          return KILN_ERROR("{}: '{}' has a bad dimension '{}'", flag, item, d);
        shape.push_back(std::stoll(d));
        p = x + 1;
        if (x == dims.size()) break;
      }
    }
    if (out.count(name)) return KILN_ERROR("{}: input '{}' given twice", flag, name);
    out[name] = shape;
  }
  return out;
}

}  // namespace kiln::cli
