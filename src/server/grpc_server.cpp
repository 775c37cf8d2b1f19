#include "server/grpc_server.h"

#include <grpc/grpc.h>
#include <grpc/support/log.h>
#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/health_check_service_interface.h>
#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>

#include <atomic>
#include <cstring>
#include <memory>

#include "common/file_read.h"
#include "common/log.h"

namespace kvsplit::server {
namespace {

// A PEM file: a regular file of at most 1 MiB (common::read_regular_file), not empty.
StatusOr<std::string> read_file(const std::string& path, const std::string& field) {
  auto data = common::read_regular_file(path, common::kMaxPemFileBytes, "PEM file");
  if (!data.ok()) return data.status().with_prefix(field);
  if (data->empty()) return invalid_argument(field + ": '" + path + "' is empty");
  return data;
}

std::atomic<void (*)()> g_on_listener_failure{nullptr};

void log_grpc_line(gpr_log_func_args* args) {
  const char* message = args->message != nullptr ? args->message : "";
  switch (args->severity) {
    case GPR_LOG_SEVERITY_DEBUG:
      KVSPLIT_LOG_DEBUG("grpc: {} ({}:{})", message, args->file, args->line);
      break;
    case GPR_LOG_SEVERITY_INFO:
      KVSPLIT_LOG_INFO("grpc: {} ({}:{})", message, args->file, args->line);
      break;
    default:
      KVSPLIT_LOG_ERROR("grpc: {} ({}:{})", message, args->file, args->line);
      break;
  }
  // tcp_server_posix.cc: any accept4 error but EINTR, EAGAIN and ECONNABORTED ends that port's
  // accept loop for good (it is not logged while the server shuts down).
  if (std::strncmp(message, "Failed accept4", 14) == 0) {
    if (void (*cb)() = g_on_listener_failure.exchange(nullptr)) cb();
  }
}

}  // namespace

void route_grpc_log(void (*on_listener_failure)()) {
  g_on_listener_failure.store(on_listener_failure);
  gpr_set_log_function(&log_grpc_line);
  // Reads GRPC_VERBOSITY now (grpc_init would later, and then keeps what is set): NONE would
  // hide the "Failed accept4" line, and with it the listener's failure.
  gpr_log_verbosity_init();
  if (!gpr_should_log(GPR_LOG_SEVERITY_ERROR)) {
    gpr_set_log_verbosity(GPR_LOG_SEVERITY_ERROR);
    KVSPLIT_LOG_INFO(
        "GRPC_VERBOSITY: gRPC's errors are logged all the same (the server reads "
        "them to see a port that stopped accepting)");
  }
}

Status check_tls_files(const config::ServerConfig& config) {
  if (!config.tls.enabled()) return ok_status();
  // The PEM blocks gRPC needs, so that a wrong file is named here: gRPC itself only fails the
  // listening port, which reads like a port in use.
  KVSPLIT_ASSIGN_OR_RETURN(std::string cert,
                           read_file(config.tls.cert_file, "server.tls.cert_file"));
  const size_t begin = cert.find("-----BEGIN ");
  if (begin == std::string::npos || cert.find("CERTIFICATE-----", begin) == std::string::npos) {
    return invalid_argument("server.tls.cert_file: " + config.tls.cert_file +
                            " holds no PEM certificate (-----BEGIN CERTIFICATE-----)");
  }
  KVSPLIT_ASSIGN_OR_RETURN(std::string key, read_file(config.tls.key_file, "server.tls.key_file"));
  if (key.find("-----BEGIN ") == std::string::npos ||
      key.find("PRIVATE KEY-----") == std::string::npos) {
    return invalid_argument("server.tls.key_file: " + config.tls.key_file +
                            " holds no PEM private key (-----BEGIN ... PRIVATE KEY-----)");
  }
  // Parsed, and the key checked against the certificate, here, before the model loads (minutes
  // for a large one): gRPC would refuse them only when the port listens, as "cannot listen".
  auto bio = [](const std::string& pem) {
    return std::unique_ptr<BIO, decltype(&BIO_free)>(
        BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())), &BIO_free);
  };
  auto cert_bio = bio(cert);
  std::unique_ptr<X509, decltype(&X509_free)> x509(
      cert_bio ? PEM_read_bio_X509(cert_bio.get(), nullptr, nullptr, nullptr) : nullptr,
      &X509_free);
  if (!x509) {
    return invalid_argument("server.tls.cert_file: " + config.tls.cert_file +
                            ": the PEM certificate does not parse");
  }
  // No passphrase: an encrypted key fails (the callback gives none) instead of prompting.
  auto no_passphrase = [](char*, int, int, void*) { return -1; };
  auto key_bio = bio(key);
  std::unique_ptr<EVP_PKEY, decltype(&EVP_PKEY_free)> pkey(
      key_bio ? PEM_read_bio_PrivateKey(key_bio.get(), nullptr, no_passphrase, nullptr) : nullptr,
      &EVP_PKEY_free);
  ERR_clear_error();
  if (!pkey) {
    return invalid_argument("server.tls.key_file: " + config.tls.key_file +
                            ": the PEM private key does not parse or is encrypted "
                            "(kvsplit-server takes an unencrypted key)");
  }
  if (X509_check_private_key(x509.get(), pkey.get()) != 1) {
    ERR_clear_error();
    return invalid_argument("server.tls.key_file: " + config.tls.key_file +
                            " does not match the certificate in server.tls.cert_file " +
                            config.tls.cert_file);
  }
  return ok_status();
}

StatusOr<RunningServer> start_grpc_server(const config::ServerConfig& config,
                                          GenerationService* service) {
  std::shared_ptr<grpc::ServerCredentials> creds = grpc::InsecureServerCredentials();
  if (config.tls.enabled()) {
    KVSPLIT_ASSIGN_OR_RETURN(std::string cert,
                             read_file(config.tls.cert_file, "server.tls.cert_file"));
    KVSPLIT_ASSIGN_OR_RETURN(std::string key,
                             read_file(config.tls.key_file, "server.tls.key_file"));
    grpc::SslServerCredentialsOptions ssl;
    ssl.pem_key_cert_pairs.push_back({key, cert});
    creds = grpc::SslServerCredentials(ssl);
  }
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();

  const std::string address =
      (config.host.find(':') != std::string::npos ? "[" + config.host + "]" : config.host) + ":" +
      std::to_string(config.port);
  RunningServer out;
  grpc::ServerBuilder builder;
  builder.AddListeningPort(address, creds, &out.port);
  builder.RegisterService(service);
  builder.SetMaxReceiveMessageSize(config.max_message_bytes);
  builder.SetMaxSendMessageSize(64 << 20);
  // Per connection, room beyond the Generate limit: one channel holding every Generate call the
  // server allows must still reach Abort, the stats and health, and get RESOURCE_EXHAUSTED from
  // the server's own count for one call more (not wait, client-side, for a stream to free).
  builder.AddChannelArgument(GRPC_ARG_MAX_CONCURRENT_STREAMS,
                             config.max_concurrent_streams + kStreamHeadroom);
  if (config.keepalive_ms > 0) {
    // Pings only while calls are open, and without limit between data frames: a call held by
    // back-pressure (its client reads nothing) sends no data, and gRPC would otherwise stop
    // pinging after two pings.
    builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS, config.keepalive_ms);
    builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, config.keepalive_timeout_ms);
    builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 0);
    builder.AddChannelArgument(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
  }
  // A connection with no call open for this long is closed (GOAWAY; a client reconnects at its
  // next call): idle connections must not pile up until the server runs out of descriptors.
  if (config.max_connection_idle_ms > 0)
    builder.AddChannelArgument(GRPC_ARG_MAX_CONNECTION_IDLE_MS, config.max_connection_idle_ms);
  // gRPC sets SO_REUSEPORT by default on Linux: a second server on the same port would bind
  // beside the first and take half its new connections instead of failing.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  out.server = builder.BuildAndStart();
  if (!out.server || out.port == 0)
    return unavailable("server: cannot listen on " + address +
                       (config.tls.enabled()
                            ? " (port in use, bad host, or a certificate and key TLS refused: "
                              "see gRPC's log above)"
                            : " (port in use or bad host?)"));
  set_serving(out.server.get(), true);
  return out;
}

void set_serving(grpc::Server* server, bool serving) {
  if (auto* health = server->GetHealthCheckService()) {
    health->SetServingStatus(serving);
    health->SetServingStatus("kvsplit.v1.Generation", serving);
  }
}

void cancel_all_calls(grpc::Server* server) { grpc_server_cancel_all_calls(server->c_server()); }

}  // namespace kvsplit::server
