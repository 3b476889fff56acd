// Engines and a model repository made in code for the server's tests: "twice" (y = 2x, x of
// [N, 4] float32, a profile of batch 1..8) and "fixed" (the same at batch 1 only).
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <string>

#include "ir/graph.h"
#include "kiln/engine.h"
#include "ops/op.h"

namespace kiln::serve::testing {

inline std::unique_ptr<Graph> twice_graph(bool dynamic) {
  auto g = std::make_unique<Graph>();
  Value* x =
      g->add_value("x", TensorType(DataType::kFloat32, {dynamic ? Dim::sym("N") : Dim(1), 4}));
  g->add_input(x);
  Value* two = g->add_constant("two", Tensor::from<float>({}, {2.f}));
  Node* n = g->add_node("Mul", "mul", {x, two}, {"y"});
  g->add_output(n->output(0));
  (void)infer_shapes(*g);
  return g;
}

inline std::filesystem::path& repository_dir() {
  static std::filesystem::path dir;
  return dir;
}

// A repository folder with twice.kiln, fixed/model.kiln and versioned/{1,3}/model.kiln, removed
// when the test program exits.
inline std::string make_repository() {
  namespace fs = std::filesystem;
  const fs::path dir =
      fs::temp_directory_path() / ("kiln_serve_test_" + std::to_string(::getpid()));
  if (repository_dir().empty()) {
    repository_dir() = dir;
    std::atexit([] {
      std::error_code ec;
      std::filesystem::remove_all(repository_dir(), ec);
    });
  }
  fs::remove_all(dir);
  fs::create_directories(dir / "fixed");
  fs::create_directories(dir / "versioned" / "1");
  fs::create_directories(dir / "versioned" / "3");
  BuildConfig c;
  c.backend = "cpu";
  c.min_shapes = {{"x", {1, 4}}};
  c.opt_shapes = {{"x", {4, 4}}};
  c.max_shapes = {{"x", {8, 4}}};
  auto e = Engine::build_from_graph(twice_graph(true), c, "twice");
  EXPECT_TRUE(e.ok()) << e.status().message();
  EXPECT_TRUE((*e)->save((dir / "twice.kiln").string()).ok());
  EXPECT_TRUE((*e)->save((dir / "versioned" / "1" / "model.kiln").string()).ok());
  EXPECT_TRUE((*e)->save((dir / "versioned" / "3" / "model.kiln").string()).ok());
  BuildConfig f;
  f.backend = "cpu";
  auto fixed = Engine::build_from_graph(twice_graph(false), f, "fixed");
  EXPECT_TRUE(fixed.ok()) << fixed.status().message();
  EXPECT_TRUE((*fixed)->save((dir / "fixed" / "model.kiln").string()).ok());
  return dir.string();
}

}  // namespace kiln::serve::testing
