// `kvsplit policy`: the KV cache manager's offline tools (docs/kvm.md, "Policy simulator").
//   policy simulate --config C --trace T [--profile P] [--json] [--write-requests F]: replay a
//     request trace against a server config's engine settings, SLA classes and kvm rules in the
//     discrete-event model;
//   policy make-trace --phased [options] --out T: write the phased benchmark trace.
#pragma once

#include <CLI/CLI.hpp>
#include <string>

#include "kvm/trace.h"

namespace kvsplit::cli {

struct PolicyFlags {
  // simulate
  std::string config;
  std::string trace;
  std::string profile;
  bool json = false;
  std::string write_requests;  // simulate: per-request predictions (JSON lines)
  // make-trace
  bool phased = false;
  std::string out;
  kvm::PhasedTraceOptions phase;
};

// Adds `policy` with its subcommands to `app`; returns the `policy` command.
CLI::App* add_policy_command(CLI::App& app, PolicyFlags& flags);

// Runs whichever subcommand was parsed. Exit status: 0 ok, 2 bad input (config, trace line,
// rule, profile: the message names it), 1 internal error.
int run_policy(CLI::App* policy, const PolicyFlags& flags);

}  // namespace kvsplit::cli
