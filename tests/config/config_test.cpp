#include "config/config.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>

#include "engine/engine_impl.h"
#include "test_util.h"

namespace kvsplit::config {
namespace {

// Asserts that `yaml` fails with kInvalidArgument and a message containing `needle`.
void expect_error(const std::string& yaml, const std::string& needle) {
  auto c = parse_config(yaml);
  ASSERT_FALSE(c.ok()) << "accepted:\n" << yaml;
  EXPECT_EQ(c.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(c.status().message().find(needle), std::string::npos)
      << "message '" << c.status().message() << "' lacks '" << needle << "'";
}

// kv.quant_fraction gives a share of the pool to the semantic cut's arenas: under another policy
// it was accepted and ignored. The file's check refuses it naming the YAML's keys (the engine's
// own check named EngineConfig.kv_quant_fraction, a field no operator writes).
TEST(ConfigTest, QuantFractionNeedsTheSemanticCut) {
  for (const char* policy : {"full", "streaming", "h2o"}) {
    expect_error(std::string("kv: {policy: ") + policy + ", quant_fraction: 0.3}\n",
                 std::string("kv.quant_fraction: must be 0 unless kv.policy is semantic (the "
                             "share goes to the int8 / int4 arenas), got 0.3 with kv.policy ") +
                     policy);
  }
  expect_error("kv: {policy: semantic, quant_fraction: 0.3, blocks_per_worker: 100}\n",
               "kv.quant_fraction: must be 0 when kv.blocks_per_worker is set");
  auto ok = parse_config("kv: {policy: semantic, quant_fraction: 0.3}\n");
  ASSERT_TRUE(ok.ok()) << ok.status().to_string();
  EXPECT_TRUE(validate_engine_config(ok->engine).ok());
  // The engine's check stays for API users who build an EngineConfig in code.
  EngineConfig api = ok->engine;
  api.kv_policy = KvPolicy::kFull;
  EXPECT_NE(validate_engine_config(api).message().find("kv_quant_fraction"), std::string::npos);
}

// The CUDA kernels are built for 16-token pages: the check after the command line's overrides
// says so under kv.block_size. Not on parsing: `kvsplit-server --backend cpu` runs a file written
// for cuda, whose pages may then be any size.
TEST(ConfigTest, CudaNeedsSixteenTokenPages) {
  auto c = parse_config("pools: {backend: cuda}\nkv: {block_size: 32}\n");
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  const Status st = validate_after_flags(*c);
  EXPECT_EQ(st.code(), StatusCode::kUnimplemented);
  EXPECT_NE(st.message().find("kv.block_size: must be 16 on the cuda backend"), std::string::npos)
      << st.to_string();
  EXPECT_NE(validate_engine_config(c->engine).message().find("EngineConfig.block_size"),
            std::string::npos);
  c->engine.backend = "cpu";  // what --backend cpu does
  EXPECT_TRUE(validate_after_flags(*c).ok());
  EXPECT_TRUE(validate_engine_config(c->engine).ok());
  auto sixteen = parse_config("pools: {backend: cuda}\nkv: {block_size: 16}\n");
  ASSERT_TRUE(sixteen.ok());
  EXPECT_TRUE(validate_after_flags(*sixteen).ok());
}

TEST(ConfigTest, EmptyDocumentGivesDefaults) {
  auto c = parse_config("");
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ(c->engine.model, EngineConfig{}.model);
  EXPECT_EQ(c->server.port, 50051);
  ASSERT_EQ(c->engine.sla_classes.size(), 1u);
  EXPECT_EQ(c->engine.sla_classes[0].name, "default");
}

TEST(ConfigTest, ParsesEverySection) {
  auto c = parse_config(R"(
model: {path: /m/stories260K.bin, tokenizer: /m/tok512.bin}
server:
  host: 127.0.0.1
  port: 7000
  metrics_port: -1
  tls: {cert_file: c.pem, key_file: k.pem}
  api_keys: [abcdefgh12, zyxwvuts98]
  max_concurrent_streams: 64
  max_tokens_limit: 512
  default_max_tokens: 32
  drain_timeout_ms: 500
pools: {mode: colocated, backend: cpu, prefill_workers: 2, decode_workers: 3, max_num_seqs: 32}
kv: {block_size: 32, capacity_mb: 64, dtype: fp32}
seed: 42
sla_classes:
  voice: {max_ttft_ms: 300, max_itl_ms: 100, priority: 10, max_queue: 50, queue_timeout_ms: 1000}
  batch: {max_ttft_ms: 60000, max_itl_ms: 2000}
)");
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ(c->engine.model, "/m/stories260K.bin");
  EXPECT_EQ(c->engine.tokenizer, "/m/tok512.bin");
  EXPECT_EQ(c->server.host, "127.0.0.1");
  EXPECT_EQ(c->server.port, 7000);
  EXPECT_EQ(c->server.metrics_port, -1);
  EXPECT_TRUE(c->server.tls.enabled());
  EXPECT_EQ(c->server.api_keys.size(), 2u);
  EXPECT_EQ(c->server.max_concurrent_streams, 64);
  EXPECT_EQ(c->server.default_max_tokens, 32);
  EXPECT_EQ(c->server.max_tokens_limit, 512);
  EXPECT_EQ(c->server.drain_timeout_ms, 500);
  EXPECT_EQ(c->server.tls.cert_file, "c.pem");
  EXPECT_EQ(c->server.tls.key_file, "k.pem");
  EXPECT_EQ(c->engine.mode, ServingMode::kColocated);
  EXPECT_EQ(c->engine.backend, "cpu");
  EXPECT_EQ(c->engine.num_prefill_workers, 2);
  EXPECT_EQ(c->engine.num_decode_workers, 3);
  EXPECT_EQ(c->engine.max_num_seqs, 32);
  EXPECT_EQ(c->engine.block_size, 32);
  EXPECT_EQ(c->engine.kv_capacity_bytes, 64ll << 20);
  EXPECT_EQ(c->engine.seed, 42u);
  ASSERT_EQ(c->engine.sla_classes.size(), 2u);
  EXPECT_EQ(c->engine.sla_classes[0].name, "voice");  // document order; the first is the default
  EXPECT_EQ(c->engine.sla_classes[0].max_ttft_ms, 300);
  EXPECT_EQ(c->engine.sla_classes[0].max_itl_ms, 100);
  EXPECT_EQ(c->engine.sla_classes[0].priority, 10);
  EXPECT_EQ(c->engine.sla_classes[0].max_queue, 50);
  EXPECT_EQ(c->engine.sla_classes[0].queue_timeout_ms, 1000);
  EXPECT_EQ(c->engine.sla_classes[1].name, "batch");
  EXPECT_EQ(c->engine.sla_classes[1].max_ttft_ms, 60000);
  EXPECT_EQ(c->engine.sla_classes[1].max_itl_ms, 2000);
  EXPECT_EQ(c->engine.sla_classes[1].max_queue, SlaClass{}.max_queue);
}

TEST(ConfigTest, ModelAsPlainString) {
  auto c = parse_config("model: synthetic:llama-110m\n");
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ(c->engine.model, "synthetic:llama-110m");
}

TEST(ConfigTest, MaxChunkTokens) {
  auto c = parse_config("");
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ(c->engine.max_chunk_tokens, 0);  // off by default
  c = parse_config("pools: {max_chunk_tokens: 32}\n");
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ(c->engine.max_chunk_tokens, 32);
  c = parse_config("pools: {max_chunk_tokens: 256}\n");
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ(c->engine.max_chunk_tokens, 256);
}

TEST(ConfigTest, MaxUnreadEvents) {
  auto c = parse_config("");
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ(c->engine.max_unread_events, 1024);
  c = parse_config("pools: {max_unread_events: 0}\n");
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ(c->engine.max_unread_events, 0);
  expect_error("pools: {max_unread_events: -1}\n", "pools.max_unread_events");
  expect_error("pools: {max_unread_events: 2000000}\n", "pools.max_unread_events");
}

TEST(ConfigTest, HandoffStallMs) {
  auto c = parse_config("");
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ(c->engine.handoff_stall_ms, 1000);
  c = parse_config("pools: {handoff_stall_ms: 0}\n");
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ(c->engine.handoff_stall_ms, 0);
  expect_error("pools: {handoff_stall_ms: -1}\n", "pools.handoff_stall_ms");
  expect_error("pools: {handoff_stall_ms: 3600001}\n", "pools.handoff_stall_ms");
}

TEST(ConfigTest, CacheAwareHandoffs) {
  auto c = parse_config("");
  ASSERT_TRUE(c.ok());
  EXPECT_TRUE(c->engine.cache_aware_handoffs);
  c = parse_config("pools: {cache_aware_handoffs: false}\n");
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_FALSE(c->engine.cache_aware_handoffs);
  expect_error("pools: {cache_aware_handoffs: sometimes}\n", "pools.cache_aware_handoffs");
}

TEST(ConfigTest, MaxChunkMsIsANumberOrAuto) {
  auto c = parse_config("");
  ASSERT_TRUE(c.ok());
  EXPECT_FALSE(c->engine.max_chunk_ms_auto);
  EXPECT_EQ(c->engine.max_chunk_ms, 0);
  c = parse_config("pools: {max_chunk_ms: auto}\n");
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_TRUE(c->engine.max_chunk_ms_auto);
  EXPECT_EQ(c->engine.max_chunk_ms, 0);
  c = parse_config("pools: {max_chunk_ms: 12.5}\n");
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_FALSE(c->engine.max_chunk_ms_auto);
  EXPECT_DOUBLE_EQ(c->engine.max_chunk_ms, 12.5);
  expect_error("pools: {max_chunk_ms: soon}\n",
               "pools.max_chunk_ms: must be a number of milliseconds or 'auto', got 'soon'");
  expect_error("pools: {max_chunk_ms: [1]}\n", "pools.max_chunk_ms");
  expect_error("pools: {max_chunk_ms: -3}\n", "pools.max_chunk_ms: must be in [0, 1e6]");
}

TEST(ConfigTest, ForwardWaitingHandoffs) {
  auto c = parse_config("");
  ASSERT_TRUE(c.ok());
  EXPECT_TRUE(c->engine.forward_waiting_handoffs);
  c = parse_config("pools: {forward_waiting_handoffs: false}\n");
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_FALSE(c->engine.forward_waiting_handoffs);
  expect_error("pools: {forward_waiting_handoffs: 2}\n", "pools.forward_waiting_handoffs");
}

TEST(ConfigTest, BadValuesNameTheField) {
  expect_error("sla_classes:\n  voice: {max_ttft_ms: 300, max_itl_ms: 0}\n",
               "sla_classes.voice.max_itl_ms: must be > 0");
  expect_error("sla_classes:\n  voice: {max_ttft_ms: -5}\n", "sla_classes.voice.max_ttft_ms");
  expect_error("sla_classes:\n  voice: {max_queue: 0}\n", "sla_classes.voice.max_queue");
  // Every value in range, but two million compute threads in all: refused, not an abort.
  expect_error(
      "pools: {mode: disaggregated, prefill_workers: 64, decode_workers: 64, "
      "threads_per_worker: 1024}\n",
      "pools.threads_per_worker: 1024 threads per worker start 262144 threads over 128 workers");
  // The same numbers on CUDA start only the sampling pools (the backend ignores the count):
  // 8 decode workers x 1024 is allowed.
  EXPECT_TRUE(
      parse_config("pools: {backend: cuda, decode_workers: 8, threads_per_worker: 1024}\n").ok());
  // "Forever" as a huge number would overflow the deadline and expire every request at once.
  expect_error("sla_classes:\n  voice: {queue_timeout_ms: 1e15}\n",
               "sla_classes.voice.queue_timeout_ms: must be in (0, 1e9]");
  expect_error("server: {port: 70000}\n", "server.port");
  expect_error("server: {port: 12abc}\n", "server.port: must be an integer");
  expect_error("server: {port: 99999999999999999999}\n", "server.port: out of range");
  expect_error("server: {port: 1.5}\n", "server.port");
  expect_error("server: {tls: {cert_file: a.pem}}\n", "server.tls");
  expect_error("server: {api_keys: short}\n", "server.api_keys");
  expect_error("server: {api_keys: [short]}\n", "server.api_keys[0]");
  expect_error("server: {max_tokens_limit: 10, default_max_tokens: 11}\n",
               "server.default_max_tokens");
  expect_error("pools: {mode: sideways}\n", "pools.mode");
  expect_error("pools: {backend: tpu}\n", "pools.backend");
  expect_error("pools: {decode_workers: 0}\n", "pools.decode_workers");
  expect_error("pools: {max_chunk_tokens: -1}\n",
               "pools.max_chunk_tokens: must be in [0, 1048576]");
  expect_error("pools: {max_chunk_tokens: many}\n", "pools.max_chunk_tokens: must be an integer");
  expect_error("kv: {block_size: 7}\n", "kv.block_size");
  expect_error("kv: {dtype: int3}\n", "kv.dtype");
  expect_error("kv: {capacity_mb: 0}\n", "kv.capacity_mb");
  expect_error("server: {keepalive_ms: -1}\n", "server.keepalive_ms: must be in [0, 86400000]");
  expect_error("server: {max_streams_per_tenant: -1}\n",
               "server.max_streams_per_tenant: must be in [0, 100000], got -1");
  expect_error("server: {keepalive_timeout_ms: 50}\n",
               "server.keepalive_timeout_ms: must be in [100, 3600000]");
  // A prompt of max_prompt_bytes and the request's other fields fit in one message.
  // (48 KiB are kept for them: config::kRequestFieldsBytes.)
  expect_error("server: {max_message_bytes: 131072, max_prompt_bytes: 131072}\n",
               "server.max_prompt_bytes: must be in [1, 81920], got 131072");
  expect_error("server: {max_message_bytes: 16384}\n",
               "server.max_message_bytes: must be in [98304, 1073741824], got 16384");
  // Values that once stood for "not given": refused like any other out of range.
  expect_error("kv: {capacity_mb: -1}\n", "kv.capacity_mb: must be in [1, 16777216], got -1");
  expect_error("pools: {mode: ''}\n", "pools.mode: must be 'colocated' or 'disaggregated'");
  expect_error("kv: {dtype: ''}\n", "kv.dtype: must be 'auto' or 'fp32'");
  expect_error("seed: -1\n", "seed: must be a non-negative integer, got '-1'");
  auto zero = parse_config("seed: -0\n");
  ASSERT_TRUE(zero.ok()) << zero.status().to_string();
  EXPECT_EQ(zero->engine.seed, 0u);
  expect_error("sla_classes: {}\n", "sla_classes");
  expect_error("sla_classes: [a, b]\n", "sla_classes");
  expect_error("sla_classes:\n  'bad name!': {max_ttft_ms: 1}\n", "sla_classes.bad name!");
  expect_error("server: [1, 2]\n", "server: must be a mapping");
  expect_error("sla_classes:\n  voice: {max_itl_ms: fast}\n", "sla_classes.voice.max_itl_ms");
  // A key with no value is not the default (kvm.mode: read as absent, it meant enforce).
  expect_error("kvm: {mode: }\n", "kvm.mode: has no value");
  expect_error("sla_classes:\n  voice: {kv: {semantic_threshold: }}\n",
               "sla_classes.voice.kv.semantic_threshold: has no value");
  expect_error("sla_classes:\n  voice: {max_ttft_ms: ~}\n",
               "sla_classes.voice.max_ttft_ms: has no value");
  // Sections too: an empty templated `api_keys:` meant no authentication, `rules:` no KVM.
  expect_error("server: {api_keys: }\n", "server.api_keys: has no value");
  expect_error("server:\n  tls:\n", "server.tls: has no value");
  expect_error("kvm:\n  rules:\n", "kvm.rules: has no value");
  expect_error("kv: {disk: ~, block_size: 16}\n", "kv.disk: has no value");
  expect_error("kv: {cuts: {semantic: null}}\n", "kv.cuts.semantic: has no value");
  expect_error("sla_classes:\n", "sla_classes: has no value");
  expect_error("model:\n", "model: has no value");
}

TEST(ConfigTest, UnknownKeysAreErrors) {
  expect_error("modle: x\n", "modle: unknown key");
  expect_error("server: {prot: 1}\n", "server.prot: unknown key");
  expect_error("sla_classes:\n  voice: {max_itl: 3}\n", "sla_classes.voice.max_itl: unknown key");
  expect_error("server: {tls: {cert: a}}\n", "server.tls.cert: unknown key");
  expect_error("kv: {blocks: 3}\n", "kv.blocks: unknown key");
}

TEST(ConfigTest, SyntaxErrorsGiveLine) {
  expect_error("server:\n  port: [1,\n", "line");
  expect_error("a: b: c\n", "YAML error");
}

// Strict YAML: each of these was accepted (exit 0 from --check-config) before.
TEST(ConfigTest, DuplicateKeysAtAnyLevelNameBothLines) {
  expect_error("seed: 1\nserver: {port: 1}\nseed: 2\n", "seed: duplicate key (lines 1 and 3)");
  expect_error("server:\n  port: 1\n  host: a\n  port: 2\n",
               "server.port: duplicate key (lines 2 and 4)");
  expect_error("sla_classes:\n  a: {max_queue: 1, max_queue: 2}\n",
               "sla_classes.a.max_queue: duplicate key");
}

TEST(ConfigTest, OneDocumentNoTagsBoundedDepth) {
  expect_error("seed: 1\n---\nseed: 2\n",
               "holds more than one YAML document (the second starts at line 2)");
  expect_error("seed: !!python/object:os.system 1\n",
               "YAML tag 'tag:yaml.org,2002:python/object:os.system' at line 1 is not supported");
  expect_error("server: !custom {port: 1}\n", "YAML tag '!custom'");
  // Deeper than our limit but within the parser's: our walker names the limit.
  std::string deep = "seed: ";
  for (int i = 0; i < 40; ++i) deep += "[";
  for (int i = 0; i < 40; ++i) deep += "]";
  expect_error(deep + "\n", "nested deeper than 32 levels (the limit)");
  // Deeper than the parser's own guard: still a message with the limit, never "bad file".
  std::string deeper = "seed: ";
  for (int i = 0; i < 5000; ++i) deeper += "[";
  expect_error(deeper + "\n", "YAML nested deeper than 32 levels (the limit)");
  // yaml-cpp's LoadAll loops forever on this (found by the fuzz target): a syntax error here.
  expect_error("   ,", "YAML error at line 1, column 4: unexpected ','");
  // The parser's message may quote the file's bytes: escaped, never a raw control byte (an ESC
  // reached the terminal).
  {
    auto bad = parse_config("model: \"\\\x1b[2J\"\n");
    ASSERT_FALSE(bad.ok());
    EXPECT_EQ(bad.status().message().find('\x1b'), std::string::npos) << bad.status().message();
    EXPECT_NE(bad.status().message().find("\\x1b"), std::string::npos) << bad.status().message();
  }
  for (const char* ok : {"", "# only a comment\n", "---\n", "---\nseed: 3\n", "seed: 3\n...\n"}) {
    auto c = parse_config(ok);
    EXPECT_TRUE(c.ok()) << "'" << ok << "': " << c.status().to_string();
  }
  // Quoted strings (the "!" non-specific tag) are fine.
  auto c = parse_config("server: {host: '127.0.0.1'}\n");
  EXPECT_TRUE(c.ok()) << c.status().to_string();
}

TEST(ConfigTest, IntegersPrintAsIntegersAndValuesAreEscaped) {
  auto c = parse_config("sla_classes:\n  a: {priority: 2147483647}\n");
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("got 2147483647"), std::string::npos) << c.status().message();
  c = parse_config("pools: {mode: \"x\\e[31my\\0\"}\n");
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("got 'x\\x1b[31my\\x00'"), std::string::npos)
      << c.status().message();
  EXPECT_EQ(c.status().message().find('\x1b'), std::string::npos);
}

TEST(ConfigTest, ConfigFileMustBeARegularFile) {
  auto c = load_config_file("/dev/zero");
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("a character device"), std::string::npos)
      << c.status().message();
}

TEST(ConfigTest, PoolDevices) {
  auto c = parse_config("pools: {devices: [0, 1, 1]}\n");
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ(c->engine.devices, (std::vector<int32_t>{0, 1, 1}));
  expect_error("pools: {devices: 3}\n", "pools.devices: must be a list of integers");
  expect_error("pools: {devices: [0, -1]}\n", "pools.devices[1]: must be in [0, 1023], got -1");
  expect_error("pools: {devices: [0, x]}\n", "pools.devices[1]: must be an integer");
}

TEST(ConfigTest, FileErrorsStartWithThePath) {
  kvsplit::testing::TempDir dir;
  const std::string path = dir.file("bad.yaml");
  std::ofstream(path) << "sla_classes:\n  voice: {max_itl_ms: 0}\n";
  auto c = load_config_file(path);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().message().rfind(path, 0), 0u) << c.status().message();
  EXPECT_NE(c.status().message().find("sla_classes.voice.max_itl_ms"), std::string::npos);
  auto missing = load_config_file(dir.file("nope.yaml"));
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
}

// A reload reads a class's kv block over the running kv.cuts.semantic, not the file's (which needs
// a restart): an edited engine section reached only the classes with a kv block of their own.
TEST(ConfigTest, AReloadReadsClassKvBlocksOverTheRunningSettings) {
  kvsplit::testing::TempDir dir;
  const std::string path = dir.file("c.yaml");
  std::ofstream(path) << "kv:\n  kv_cache_compression: semantic_v2\n"
                         "  cuts: {semantic: {evict_threshold: 0.1, recent_tokens: 8}}\n"
                         "sla_classes:\n  voice: {kv: {semantic_threshold: 0.2}}\n  bg: {}\n";
  SemanticCutConfig running;
  running.evict_threshold = 0.05f;
  running.recent_tokens = 256;
  auto reload = load_config_file(path, running);
  ASSERT_TRUE(reload.ok()) << reload.status().to_string();
  ASSERT_TRUE(reload->engine.sla_classes[0].semantic.has_value());
  const SemanticCutConfig& voice = *reload->engine.sla_classes[0].semantic;
  EXPECT_FLOAT_EQ(voice.semantic_threshold, 0.2f);
  EXPECT_FLOAT_EQ(voice.evict_threshold, 0.05f);
  EXPECT_EQ(voice.recent_tokens, 256);
  EXPECT_FALSE(reload->engine.sla_classes[1].semantic.has_value());
  auto start = load_config_file(path);  // at start the file's section is the base
  ASSERT_TRUE(start.ok()) << start.status().to_string();
  EXPECT_FLOAT_EQ(start->engine.sla_classes[0].semantic->evict_threshold, 0.1f);
  EXPECT_EQ(start->engine.sla_classes[0].semantic->recent_tokens, 8);
}

// Every shipped config parses and validates (CI also runs kvsplit-server --check-config on them).
TEST(ConfigTest, KvCutKeys) {
  auto c = parse_config(
      "kv:\n"
      "  kv_cache_compression: semantic_v2\n"
      "  quant_fraction: 0.5\n"
      "  cuts:\n"
      "    semantic: {semantic_threshold: 0.15, evict_threshold: 0.05, demote_after_steps: 2,\n"
      "               evict_after_steps: 3, recall_threshold: 0.4, semantic_window: 4096,\n"
      "               sink_tokens: 4, recent_tokens: 256, score_interval: 2, smoothing: 0.6,\n"
      "               host_capacity_mb: 2048, heavy_tokens: 32, recall_precision: int4,\n"
      "               max_recalls_per_step: 2, summary_parts: 4}\n"
      "sla_classes:\n"
      "  voice: {max_ttft_ms: 300, kv: {semantic_threshold: 0.2, recall_precision: full}}\n"
      "  coding: {kv: {semantic_threshold: 0.1, recent_tokens: 512}}\n"
      "  batch: {priority: -1}\n");
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  const EngineConfig& e = c->engine;
  EXPECT_EQ(e.kv_policy, KvPolicy::kSemantic);
  EXPECT_DOUBLE_EQ(e.kv_quant_fraction, 0.5);
  EXPECT_FLOAT_EQ(e.semantic.semantic_threshold, 0.15f);
  EXPECT_FLOAT_EQ(e.semantic.evict_threshold, 0.05f);
  EXPECT_EQ(e.semantic.demote_after_steps, 2);
  EXPECT_EQ(e.semantic.evict_after_steps, 3);
  EXPECT_FLOAT_EQ(e.semantic.recall_threshold, 0.4f);
  EXPECT_EQ(e.semantic.semantic_window, 4096);
  EXPECT_EQ(e.semantic.sink_tokens, 4);
  EXPECT_EQ(e.semantic.recent_tokens, 256);
  EXPECT_EQ(e.semantic.score_interval, 2);
  EXPECT_FLOAT_EQ(e.semantic.smoothing, 0.6f);
  EXPECT_EQ(e.semantic.host_capacity_mb, 2048);
  EXPECT_EQ(e.semantic.heavy_tokens, 32);
  EXPECT_EQ(e.semantic.recall_precision, RecallPrecision::kInt4);
  EXPECT_EQ(e.semantic.max_recalls_per_step, 2);
  EXPECT_EQ(e.semantic.summary_parts, 4);
  ASSERT_EQ(e.sla_classes.size(), 3u);
  // A class's kv keys override the engine's settings one by one.
  ASSERT_TRUE(e.sla_classes[0].semantic.has_value());
  EXPECT_FLOAT_EQ(e.sla_classes[0].semantic->semantic_threshold, 0.2f);
  EXPECT_EQ(e.sla_classes[0].semantic->score_interval, 2);
  EXPECT_EQ(e.sla_classes[0].semantic->recall_precision, RecallPrecision::kFull);
  EXPECT_EQ(e.sla_classes[0].semantic->max_recalls_per_step, 2);
  EXPECT_EQ(e.sla_classes[1].semantic->recall_precision, RecallPrecision::kInt4);
  ASSERT_TRUE(e.sla_classes[1].semantic.has_value());
  EXPECT_FLOAT_EQ(e.sla_classes[1].semantic->semantic_threshold, 0.1f);
  EXPECT_EQ(e.sla_classes[1].semantic->recent_tokens, 512);
  EXPECT_FALSE(e.sla_classes[2].semantic.has_value());

  // The switches: kv.policy, cuts.semantic.enabled (= semantic_v2), none.
  auto p = parse_config("kv: {policy: h2o, cuts: {semantic: {heavy_tokens: 8}}}\n");
  ASSERT_TRUE(p.ok()) << p.status().to_string();
  EXPECT_EQ(p->engine.kv_policy, KvPolicy::kH2O);
  p = parse_config("kv: {policy: streaming}\n");
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->engine.kv_policy, KvPolicy::kStreaming);
  p = parse_config("kv: {cuts: {semantic: {enabled: true}}}\n");
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->engine.kv_policy, KvPolicy::kSemantic);
  p = parse_config("kv: {kv_cache_compression: none}\n");
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->engine.kv_policy, KvPolicy::kFull);
  p = parse_config("kv: {policy: semantic, kv_cache_compression: semantic_v2}\n");
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->engine.kv_policy, KvPolicy::kSemantic);
  p = parse_config("{}\n");
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->engine.kv_policy, KvPolicy::kFull);
}

TEST(ConfigTest, KvCutErrorsNameTheField) {
  expect_error("kv: {policy: quest}\n", "kv.policy: must be");
  expect_error("kv: {kv_cache_compression: semantic_v3}\n", "kv.kv_cache_compression: must be");
  expect_error("kv: {policy: streaming, kv_cache_compression: semantic_v2}\n",
               "kv.kv_cache_compression: asks for KV policy 'semantic' but kv.policy");
  expect_error("kv: {policy: semantic, cuts: {semantic: {enabled: false}}}\n",
               "kv.cuts.semantic.enabled: is false");
  // none is full KV, as --kv-cache-compression none is, whichever field comes later.
  expect_error("kv: {kv_cache_compression: none, cuts: {semantic: {enabled: true}}}\n",
               "kv.cuts.semantic.enabled: asks for KV policy 'semantic' but "
               "kv.kv_cache_compression asks for 'full'");
  expect_error("kv: {policy: streaming, kv_cache_compression: none}\n",
               "kv.kv_cache_compression: asks for KV policy 'full' but kv.policy asks for "
               "'streaming'");
  expect_error("kv: {cuts: {semantic: {enabled: maybe}}}\n",
               "kv.cuts.semantic.enabled: must be true or false");
  expect_error("kv: {cuts: {semantic: {semantic_threshold: 1.5}}}\n",
               "kv.cuts.semantic.semantic_threshold: must be in [0, 1]");
  expect_error("kv: {cuts: {semantic: {semantic_threshold: high}}}\n",
               "kv.cuts.semantic.semantic_threshold: must be a finite number");
  expect_error("kv: {cuts: {semantic: {semantic_threshold: 0.1, evict_threshold: 0.2}}}\n",
               "kv.cuts.semantic.evict_threshold: must be below semantic_threshold");
  expect_error("kv: {cuts: {semantic: {score_interval: 0}}}\n",
               "kv.cuts.semantic.score_interval: must be >= 1");
  expect_error("kv: {cuts: {semantic: {smoothing: 0}}}\n", "kv.cuts.semantic.smoothing");
  expect_error("kv: {cuts: {semantic: {recent_tokens: 2.5}}}\n",
               "kv.cuts.semantic.recent_tokens: must be an integer");
  expect_error("kv: {cuts: {semantic: {host_capacity_mb: -1}}}\n",
               "kv.cuts.semantic.host_capacity_mb: must be in [0, 16777216]");
  expect_error("kv: {cuts: {semantic: {host_capacity_mb: 9000000000000}}}\n",
               "kv.cuts.semantic.host_capacity_mb: must be in [0, 16777216], got 9000000000000");
  expect_error("kv: {cuts: [1]}\n", "kv.cuts: must be a mapping");
  expect_error("kv: {cuts: {semantic: {recall_precision: int2}}}\n",
               "kv.cuts.semantic.recall_precision: must be 'full', 'int8' or 'int4', got 'int2'");
  expect_error("kv: {cuts: {semantic: {max_recalls_per_step: -1}}}\n",
               "kv.cuts.semantic.max_recalls_per_step: must be >= 0");
  expect_error("kv: {cuts: {semantic: {summary_parts: 0}}}\n",
               "kv.cuts.semantic.summary_parts: must be in [1, 1024], got 0");
  expect_error("kv: {block_size: 16, cuts: {semantic: {summary_parts: 3}}}\n",
               "kv.cuts.semantic.summary_parts: must divide kv.block_size 16, got 3");
  // Pool sizes and layouts are per worker: a class may not set them (they were ignored before).
  expect_error("sla_classes:\n  voice: {kv: {summary_parts: 2}}\n",
               "sla_classes.voice.kv.summary_parts: is a per-worker pool setting");
  expect_error("sla_classes:\n  voice: {kv: {host_capacity_mb: 64}}\n",
               "sla_classes.voice.kv.host_capacity_mb: is a per-worker pool setting");
  expect_error("sla_classes:\n  voice: {kv: {recall_precision: fp8}}\n",
               "sla_classes.voice.kv.recall_precision: must be 'full', 'int8' or 'int4'");
  expect_error("sla_classes:\n  voice: {kv: {semantic_threshold: -0.2}}\n",
               "sla_classes.voice.kv.semantic_threshold: must be in [0, 1]");
  expect_error("sla_classes:\n  voice: {kv: {demote_after_steps: 0}}\n",
               "sla_classes.voice.kv.demote_after_steps");
  expect_error("sla_classes:\n  voice: {kv: 0.2}\n", "sla_classes.voice.kv: must be a mapping");
}

// The KV cuts run on both backends (the CUDA kernels of kernels/attention/mixed_attention.h).
TEST(ConfigTest, KvCutOnTheCudaBackendIsAccepted) {
  auto c = parse_config("kv: {policy: semantic}\npools: {backend: cuda}\n");
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ(c->engine.kv_policy, KvPolicy::kSemantic);
  EXPECT_EQ(c->engine.backend, "cuda");
}

TEST(ConfigTest, KvCutUnknownKeysAreErrors) {
  expect_error("kv: {cuts: {spatial: {shard: 2}}}\n", "kv.cuts.spatial.shard: unknown key");
  expect_error("kv: {cuts: {spacial: {shards: 2}}}\n", "kv.cuts.spacial: unknown key");
  expect_error("kv: {cuts: {semantic: {threshold: 0.1}}}\n",
               "kv.cuts.semantic.threshold: unknown key");
  expect_error("sla_classes:\n  voice: {kv: {semantic_treshold: 0.2}}\n",
               "sla_classes.voice.kv.semantic_treshold: unknown key");
  // `enabled` is the engine-wide switch, not a per-class setting.
  expect_error("sla_classes:\n  voice: {kv: {enabled: true}}\n",
               "sla_classes.voice.kv.enabled: unknown key");
}

TEST(ConfigTest, ShippedConfigsAreValid) {
  const std::filesystem::path dir = std::filesystem::path(KVSPLIT_SOURCE_DIR) / "configs";
  // Every file there, so a new one is checked too (a fixed list of four could not notice one).
  std::vector<std::string> names;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    if (entry.path().extension() == ".yaml") names.push_back(entry.path().filename().string());
  }
  std::sort(names.begin(), names.end());
  for (const char* shipped : {"default.yaml", "voice-assistant.yaml", "finance-knowledge-base.yaml",
                              "coding-assistant.yaml"}) {
    EXPECT_NE(std::find(names.begin(), names.end(), shipped), names.end()) << shipped;
  }
  for (const std::string& name : names) {
    auto c = load_config_file((dir / name).string());
    EXPECT_TRUE(c.ok()) << name << ": " << c.status().to_string();
    if (!c.ok()) continue;
    // The engine's own checks too (a KVM rule needs its cut on), as --check-config runs them.
    const Status st = validate_engine_config(c->engine);
    EXPECT_TRUE(st.ok()) << name << ": " << st.to_string();
    // The scenario configs express the seed's table with KVM rules (issue: scenario configs).
    if (name != "default.yaml") {
      EXPECT_GE(c->engine.kvm.rules.size(), 3u) << name;
    }
  }
  auto voice = load_config_file((dir / "voice-assistant.yaml").string());
  ASSERT_TRUE(voice.ok());
  EXPECT_LE(voice->engine.sla_classes[0].max_ttft_ms, 300);
  EXPECT_LE(voice->engine.sla_classes[0].max_itl_ms, 100);
  // kv-cuts.md §2: voice 0.2, coding 0.1.
  ASSERT_TRUE(voice->engine.sla_classes[0].semantic.has_value());
  EXPECT_FLOAT_EQ(voice->engine.sla_classes[0].semantic->semantic_threshold, 0.2f);
  auto coding = load_config_file((dir / "coding-assistant.yaml").string());
  ASSERT_TRUE(coding.ok());
  for (const SlaClass& c : coding->engine.sla_classes) {
    ASSERT_TRUE(c.semantic.has_value()) << c.name;
    EXPECT_FLOAT_EQ(c.semantic->semantic_threshold, 0.1f) << c.name;
  }
}

}  // namespace
TEST(ConfigTest, KvQuantFractionIsBounded) {
  for (const char* bad : {"-0.1", "0.95", "abc"}) {
    auto c = parse_config(std::string("kv:\n  quant_fraction: ") + bad + "\n");
    ASSERT_FALSE(c.ok()) << bad;
    EXPECT_NE(c.status().message().find("kv.quant_fraction"), std::string::npos)
        << c.status().to_string();
  }
}

}  // namespace kvsplit::config

namespace kvsplit::config {
namespace {

// kv.prefix_spill_ahead_blocks: read into EngineConfig::prefix_spill_ahead_blocks (0, off, by
// default); out of range or not an integer, an error naming the field. The engine refuses the
// same range when given the struct directly.
TEST(ConfigTest, PrefixSpillAheadBlocks) {
  auto c = parse_config("");
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ(c->engine.prefix_spill_ahead_blocks, 0);
  c = parse_config("kv: {prefix_cache: on, host_capacity_mb: 64, prefix_spill_ahead_blocks: 48}\n");
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ(c->engine.prefix_spill_ahead_blocks, 48);
  c = parse_config("kv: {prefix_spill_ahead_blocks: 16777216}\n");
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ(c->engine.prefix_spill_ahead_blocks, 1 << 24);
  expect_error("kv: {prefix_spill_ahead_blocks: -1}\n",
               "kv.prefix_spill_ahead_blocks: must be in [0, 16777216], got -1");
  expect_error("kv: {prefix_spill_ahead_blocks: 16777217}\n",
               "kv.prefix_spill_ahead_blocks: must be in [0, 16777216], got 16777217");
  expect_error("kv: {prefix_spill_ahead_blocks: lots}\n",
               "kv.prefix_spill_ahead_blocks: must be an integer");
  expect_error("kv: {prefix_spill_ahead_blocks: 2.5}\n", "kv.prefix_spill_ahead_blocks");
  EngineConfig e;
  e.model = "synthetic:stories260k";
  e.prefix_spill_ahead_blocks = -1;
  auto engine = EngineImpl::create(e);
  ASSERT_FALSE(engine.ok());
  EXPECT_NE(engine.status().message().find("prefix_spill_ahead_blocks"), std::string::npos)
      << engine.status().to_string();
}

TEST(ConfigTest, TemporalCutKeys) {
  auto c = parse_config(
      "kv:\n"
      "  host_capacity_mb: 512\n"
      "  disk: {path: /var/tmp/kv, capacity_mb: 2048, direct_io: true}\n"
      "  prefix_cache: on\n"
      "  cuts:\n"
      "    temporal: {temporal_step_size: 4, swap: always}\n");
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ(c->engine.temporal.host_capacity_mb, 512);
  EXPECT_EQ(c->engine.temporal.temporal_step_size, 4);
  EXPECT_EQ(c->engine.temporal.swap, SwapMode::kAlways);
  EXPECT_EQ(c->engine.temporal.disk_path, "/var/tmp/kv");
  EXPECT_EQ(c->engine.temporal.disk_capacity_mb, 2048);
  EXPECT_TRUE(c->engine.temporal.disk_direct_io);
  EXPECT_TRUE(c->engine.temporal.disk_write_behind);  // the default
  EXPECT_TRUE(c->engine.prefix_cache);
  EXPECT_FALSE(parse_config("kv: {disk: {path: /tmp/kv, direct_io: maybe}}\n").ok());
  auto sync = parse_config("kv: {disk: {path: /tmp/kv, write_behind: false}}\n");
  ASSERT_TRUE(sync.ok()) << sync.status().to_string();
  EXPECT_FALSE(sync->engine.temporal.disk_write_behind);
  auto odd = parse_config("kv: {disk: {path: /tmp/kv, write_behind: sometimes}}\n");
  ASSERT_FALSE(odd.ok());
  EXPECT_NE(odd.status().message().find("kv.disk.write_behind"), std::string::npos)
      << odd.status().to_string();
  auto cls = parse_config(
      "sla_classes:\n"
      "  voice: {max_hold_ms: 500, kv: {swap: never, temporal_step_size: 1}}\n"
      "  batch: {kv: {temporal_step_size: 8}}\n");
  ASSERT_TRUE(cls.ok()) << cls.status().to_string();
  ASSERT_EQ(cls->engine.sla_classes.size(), 2u);
  EXPECT_EQ(cls->engine.sla_classes[0].swap, SwapMode::kNever);
  EXPECT_EQ(cls->engine.sla_classes[0].temporal_step_size, 1);
  EXPECT_DOUBLE_EQ(cls->engine.sla_classes[0].max_hold_ms, 500);
  EXPECT_FALSE(cls->engine.sla_classes[1].swap.has_value());
  EXPECT_EQ(cls->engine.sla_classes[1].temporal_step_size, 8);
  // Temporal keys only: no semantic override, so the class follows the engine's semantic
  // settings (and the KV cache manager's engine-wide changes to them).
  EXPECT_FALSE(cls->engine.sla_classes[0].semantic.has_value());
  EXPECT_FALSE(cls->engine.sla_classes[1].semantic.has_value());
  auto sem = parse_config("sla_classes:\n  voice: {kv: {evict_threshold: 0.01, swap: never}}\n");
  ASSERT_TRUE(sem.ok()) << sem.status().to_string();
  ASSERT_TRUE(sem->engine.sla_classes[0].semantic.has_value());
  EXPECT_FLOAT_EQ(sem->engine.sla_classes[0].semantic->evict_threshold, 0.01f);
  const std::pair<const char*, const char*> bad[] = {
      {"kv:\n  host_capacity_mb: -1\n", "kv.host_capacity_mb"},
      {"kv:\n  disk: {capacity_mb: 5}\n", "kv.disk.path"},
      {"kv:\n  prefix_cache: maybe\n", "kv.prefix_cache"},
      {"sla_classes:\n  v: {kv: {swap: often}}\n", "sla_classes.v.kv.swap"},
      {"sla_classes:\n  v: {kv: {temporal_step_size: 0}}\n", "sla_classes.v.kv.temporal_step_size"},
      {"sla_classes:\n  v: {max_hold_ms: -1}\n", "sla_classes.v.max_hold_ms"},
      {"kv:\n  disk: {path: /tmp/x, capacity_mb: 0}\n", "kv.disk.capacity_mb"},
      {"kv:\n  disk: {path: /tmp/x, size: 3}\n", "kv.disk.size"},
      {"kv:\n  cuts:\n    temporal: {swap: sometimes}\n", "kv.cuts.temporal.swap"},
      {"kv:\n  cuts:\n    temporal: {temporal_step_size: 0}\n",
       "kv.cuts.temporal.temporal_step_size"},
      {"kv:\n  cuts:\n    temporal: {swapp: auto}\n", "swapp"},
  };
  for (const auto& [yaml, field] : bad) {
    auto r = parse_config(yaml);
    ASSERT_FALSE(r.ok()) << yaml;
    EXPECT_NE(r.status().message().find(field), std::string::npos) << r.status().to_string();
  }
}

}  // namespace
}  // namespace kvsplit::config

namespace kvsplit::config {
namespace {

TEST(ConfigTest, SpatialCutKeys) {
  auto c = parse_config(
      "kv:\n"
      "  block_size: 16\n"
      "  cuts:\n"
      "    spatial: {shards: 4, spatial_chunk_size: 8192, min_context: 16384}\n");
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ(c->engine.spatial.shards, 4);
  EXPECT_EQ(c->engine.spatial.spatial_chunk_size, 8192);
  EXPECT_EQ(c->engine.spatial.min_context, 16384);
  auto cls =
      parse_config("sla_classes:\n  long: {kv: {spread: true}}\n  chat: {kv: {spread: false}}\n");
  ASSERT_TRUE(cls.ok()) << cls.status().to_string();
  EXPECT_EQ(cls->engine.sla_classes[0].spread, std::optional<bool>(true));
  EXPECT_EQ(cls->engine.sla_classes[1].spread, std::optional<bool>(false));
  auto d = parse_config("kv:\n  cuts:\n    spatial: {}\n");
  ASSERT_TRUE(d.ok()) << d.status().to_string();
  EXPECT_EQ(d->engine.spatial.shards, 1);  // off unless asked
  // The semantic cut acts on sharded sequences (per shard): the two go together.
  auto both =
      parse_config("kv:\n  kv_cache_compression: semantic_v2\n  cuts:\n    spatial: {shards: 2}\n");
  ASSERT_TRUE(both.ok()) << both.status().to_string();
  EXPECT_EQ(both->engine.spatial.shards, 2);
  EXPECT_EQ(both->engine.kv_policy, KvPolicy::kSemantic);
  // Shards run on the CUDA backend too (virtual shards on one GPU, or one GPU per shard).
  auto cuda = parse_config("pools: {backend: cuda}\nkv:\n  cuts:\n    spatial: {shards: 2}\n");
  ASSERT_TRUE(cuda.ok()) << cuda.status().to_string();
  EXPECT_EQ(cuda->engine.spatial.shards, 2);
  EXPECT_EQ(cuda->engine.backend, "cuda");
  const std::pair<const char*, const char*> bad[] = {
      {"kv:\n  cuts:\n    spatial: {shards: 0}\n", "kv.cuts.spatial.shards"},
      {"kv:\n  cuts:\n    spatial: {shards: 17}\n", "kv.cuts.spatial.shards"},
      {"kv:\n  cuts:\n    spatial: {spatial_chunk_size: 0}\n",
       "kv.cuts.spatial.spatial_chunk_size"},
      {"kv:\n  block_size: 16\n  cuts:\n    spatial: {spatial_chunk_size: 24}\n",
       "kv.cuts.spatial.spatial_chunk_size"},
      {"kv:\n  cuts:\n    spatial: {min_context: -1}\n", "kv.cuts.spatial.min_context"},
      {"kv:\n  cuts:\n    spatial: {shard: 2}\n", "shard"},
      {"sla_classes:\n  v: {kv: {spread: maybe}}\n", "sla_classes.v.kv.spread"},
  };
  for (const auto& [yaml, field] : bad) {
    auto r = parse_config(yaml);
    ASSERT_FALSE(r.ok()) << yaml;
    EXPECT_NE(r.status().message().find(field), std::string::npos) << r.status().to_string();
  }
}

TEST(ConfigTest, SpatialCommunicatorKey) {
  auto d = parse_config("kv:\n  cuts:\n    spatial: {shards: 2}\n");
  ASSERT_TRUE(d.ok()) << d.status().to_string();
  EXPECT_EQ(d->engine.spatial.communicator, SpatialCommunicator::kAuto);  // the default
  const std::pair<const char*, SpatialCommunicator> good[] = {
      {"auto", SpatialCommunicator::kAuto},
      {"in_process", SpatialCommunicator::kInProcess},
      {"nccl", SpatialCommunicator::kNccl},
  };
  for (const auto& [name, want] : good) {
    // Parsing never looks at the build or the devices: the engine decides at start-up.
    auto c = parse_config(std::string("kv:\n  cuts:\n    spatial: {shards: 2, communicator: ") +
                          name + "}\n");
    ASSERT_TRUE(c.ok()) << name << ": " << c.status().to_string();
    EXPECT_EQ(c->engine.spatial.communicator, want) << name;
    EXPECT_STREQ(spatial_communicator_name(want), name);
  }
  for (const char* bad : {"mpi", "in-process", "NCCL", "\"\""}) {
    auto r = parse_config(std::string("kv:\n  cuts:\n    spatial: {communicator: ") + bad + "}\n");
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(r.status().message().find("kv.cuts.spatial.communicator"), std::string::npos)
        << r.status().to_string();
  }
}

}  // namespace
}  // namespace kvsplit::config
