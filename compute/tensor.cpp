#include "compute/tensor.hpp"

#include <sstream>

namespace asgd {

std::string shape_string(const Shape& shape) {
  std::ostringstream out;
  out << '(';
  for (std::size_t i = 0; i < shape.size(); ++i) out << (i ? ", " : "") << shape[i];
  out << ')';
  return out.str();
}

}  // namespace asgd
