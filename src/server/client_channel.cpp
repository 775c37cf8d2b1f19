#include "server/client_channel.h"

#include "common/file_read.h"

namespace kvsplit::server {

StatusOr<std::shared_ptr<grpc::Channel>> make_channel(const ClientOptions& options) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(64 << 20);
  std::shared_ptr<grpc::ChannelCredentials> creds = grpc::InsecureChannelCredentials();
  if (!options.tls_ca.empty()) {
    auto pem = common::read_regular_file(options.tls_ca, common::kMaxPemFileBytes, "PEM file");
    if (!pem.ok()) return pem.status().with_prefix("--tls-ca");
    grpc::SslCredentialsOptions ssl;
    ssl.pem_root_certs = std::move(*pem);
    creds = grpc::SslCredentials(ssl);
    if (!options.tls_server_name.empty()) args.SetSslTargetNameOverride(options.tls_server_name);
  }
  return grpc::CreateCustomChannel(options.server, creds, args);
}

void add_auth(const ClientOptions& options, grpc::ClientContext* context) {
  if (!options.api_key.empty()) context->AddMetadata("authorization", "Bearer " + options.api_key);
}

}  // namespace kvsplit::server
