// The parts of the elementwise family table, one per source file; elementwise_ops() joins them.
#pragma once

#include <span>

#include "ops/op.h"

namespace kiln::ew {

std::span<const OpDef> unary_table();   // elementwise.cpp
std::span<const OpDef> binary_table();  // elementwise_binary.cpp
std::span<const OpDef> misc_table();    // elementwise_misc.cpp

}  // namespace kiln::ew
