#include "server/client_channel.h"

#include <fstream>
#include <sstream>

namespace kvsplit::server {

StatusOr<std::shared_ptr<grpc::Channel>> make_channel(const ClientOptions& options) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(64 << 20);
  std::shared_ptr<grpc::ChannelCredentials> creds = grpc::InsecureChannelCredentials();
  if (!options.tls_ca.empty()) {
    std::ifstream in(options.tls_ca, std::ios::binary);
    if (!in) return invalid_argument("--tls-ca: cannot read '" + options.tls_ca + "'");
    std::ostringstream ss;
    ss << in.rdbuf();
    grpc::SslCredentialsOptions ssl;
    ssl.pem_root_certs = ss.str();
    creds = grpc::SslCredentials(ssl);
    if (!options.tls_server_name.empty()) args.SetSslTargetNameOverride(options.tls_server_name);
  }
  return grpc::CreateCustomChannel(options.server, creds, args);
}

void add_auth(const ClientOptions& options, grpc::ClientContext* context) {
  if (!options.api_key.empty()) context->AddMetadata("authorization", "Bearer " + options.api_key);
}

}  // namespace kvsplit::server
