// Running the kvsplit binary from a test: its exit status, stdout and stderr.
#pragma once

#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
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

// Sets r's exit code from a wait status (-1 when killed by a signal) and its err from the file
// kvsplit's stderr went to.
inline void finish_run(int status, const std::string& err_file, RunResult* r) {
  r->exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  std::ifstream ef(err_file);
  std::stringstream ss;
  ss << ef.rdbuf();
  r->err = ss.str();
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
  finish_run(status, err_file, &r);
  return r;
}

// Runs `kvsplit args` with stdout a pipe that no process reads from (its read end is closed
// before kvsplit starts, as in `kvsplit ... | true`): every write to stdout fails with EPIPE (or
// raises SIGPIPE, should kvsplit not ignore it: exit_code -1 then). `out` stays empty.
inline RunResult run_into_closed_pipe(const std::string& args) {
  TempDir tmp;
  const std::string err_file = tmp.file("stderr");
  const std::string cmd = "exec " + quote(std::string(KVSPLIT_BINARY_DIR) + "/kvsplit") + " " +
                          args + " 2>" + quote(err_file);
  RunResult r;
  int fds[2];
  if (pipe(fds) != 0) return r;
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addclose(&fa, fds[0]);
  posix_spawn_file_actions_adddup2(&fa, fds[1], STDOUT_FILENO);
  posix_spawn_file_actions_addclose(&fa, fds[1]);
  // SIGPIPE at its default (kill), whatever this process does with it: kvsplit decides.
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  sigset_t pipe_signal;
  sigemptyset(&pipe_signal);
  sigaddset(&pipe_signal, SIGPIPE);
  posix_spawnattr_setsigdefault(&attr, &pipe_signal);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGDEF);
  const char* argv[] = {"sh", "-c", cmd.c_str(), nullptr};
  pid_t pid = -1;
  const int spawned =
      posix_spawn(&pid, "/bin/sh", &fa, &attr, const_cast<char* const*>(argv), environ);
  posix_spawn_file_actions_destroy(&fa);
  posix_spawnattr_destroy(&attr);
  close(fds[0]);
  close(fds[1]);
  if (spawned != 0) return r;
  int status = 0;
  if (waitpid(pid, &status, 0) != pid) return r;
  finish_run(status, err_file, &r);
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
