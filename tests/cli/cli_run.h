// Running the kvsplit binary from a test: its exit status, stdout and stderr.
#pragma once

#include <sys/wait.h>

#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "test_util.h"

namespace kvsplit::testing {

struct RunResult {
  int exit_code = -1;
  std::string out;
  std::string err;
};

inline std::string quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) {
    if (c == '\'')
      q += "'\\''";
    else
      q += c;
  }
  return q + "'";
}

inline RunResult run(const std::string& args, const std::string& env = "",
                     const std::string& cwd = "") {
  TempDir tmp;
  const std::string err_file = tmp.file("stderr");
  std::string cmd;
  if (!cwd.empty()) cmd += "cd " + quote(cwd) + " && ";
  cmd += env + " " + quote(std::string(KVSPLIT_BINARY_DIR) + "/kvsplit") + " " + args + " 2>" +
         quote(err_file);
  RunResult r;
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return r;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) r.out.append(buf, n);
  const int status = pclose(p);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  std::ifstream ef(err_file);
  std::stringstream ss;
  ss << ef.rdbuf();
  r.err = ss.str();
  return r;
}

// `--model ... --tokenizer ...` naming stories260K in llama2.c format (the shared models).
inline std::string stories_model_flags() {
  return "--model " + quote(model_path("stories260K.bin")) + " --tokenizer " +
         quote(model_path("tok512.bin"));
}

inline std::vector<nlohmann::json> json_lines(const std::string& out) {
  std::vector<nlohmann::json> v;
  std::istringstream in(out);
  std::string line;
  while (std::getline(in, line)) {
    if (!line.empty()) v.push_back(nlohmann::json::parse(line));
  }
  return v;
}

}  // namespace kvsplit::testing
