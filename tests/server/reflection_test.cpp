// Server reflection as grpcurl uses it, without our proto file: list the services, then build a
// client-side DescriptorPool whose files come only from the server (the reflection stream) and
// resolve kvsplit.v1.Generation and kvsplit.v1.GenerateRequest in it.
//
// gRPC's client-side grpc::ProtoReflectionDescriptorDatabase lives in its test/cpp/util tree and
// is not part of Debian's libgrpc++-dev, so ReflectionDatabase below is the same thing, small:
// requests and responses are dynamic messages of the grpc.reflection.v1alpha descriptors that
// libgrpc++_reflection registers in the generated pool, sent over a GenericStub stream.
#include <google/protobuf/descriptor.h>
#include <google/protobuf/descriptor.pb.h>
#include <google/protobuf/descriptor_database.h>
#include <google/protobuf/dynamic_message.h>
#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "config/config.h"
#include "kvsplit/engine.h"
#include "server/generation_service.h"
#include "server/grpc_server.h"

namespace kvsplit::server {
namespace {

namespace pb = ::google::protobuf;

constexpr char kReflectionMethod[] =
    "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo";

// A DescriptorDatabase answered by a server's reflection service (one stream per query).
class ReflectionDatabase : public pb::DescriptorDatabase {
 public:
  explicit ReflectionDatabase(std::shared_ptr<grpc::Channel> channel) : stub_(std::move(channel)) {
    // Make sure libgrpc++_reflection (and with it the reflection descriptors) is loaded.
    grpc::reflection::InitProtoReflectionServerBuilderPlugin();
    const pb::DescriptorPool* pool = pb::DescriptorPool::generated_pool();
    request_type_ = pool->FindMessageTypeByName("grpc.reflection.v1alpha.ServerReflectionRequest");
    response_type_ =
        pool->FindMessageTypeByName("grpc.reflection.v1alpha.ServerReflectionResponse");
  }

  bool usable() const { return request_type_ != nullptr && response_type_ != nullptr; }

  // The service names the server lists; empty with *error set on failure.
  std::vector<std::string> list_services(std::string* error) {
    std::vector<std::string> names;
    auto resp = query("list_services", "*", error);
    if (!resp) return names;
    const pb::Reflection* r = resp->GetReflection();
    const pb::FieldDescriptor* list = response_type_->FindFieldByName("list_services_response");
    if (!r->HasField(*resp, list)) {
      *error = "no list_services_response in: " + resp->ShortDebugString();
      return names;
    }
    const pb::Message& services = r->GetMessage(*resp, list);
    const pb::FieldDescriptor* service = services.GetDescriptor()->FindFieldByName("service");
    for (int i = 0; i < services.GetReflection()->FieldSize(services, service); ++i) {
      const pb::Message& s = services.GetReflection()->GetRepeatedMessage(services, service, i);
      names.push_back(s.GetReflection()->GetString(s, s.GetDescriptor()->FindFieldByName("name")));
    }
    return names;
  }

  bool FindFileByName(const std::string& filename, pb::FileDescriptorProto* output) override {
    if (auto it = files_.find(filename); it != files_.end()) {
      *output = it->second;
      return true;
    }
    return fetch("file_by_filename", filename) && lookup(filename, output);
  }
  bool FindFileContainingSymbol(const std::string& symbol,
                                pb::FileDescriptorProto* output) override {
    std::string file;
    if (!fetch("file_containing_symbol", symbol, &file)) return false;
    return lookup(file, output);
  }
  bool FindFileContainingExtension(const std::string&, int, pb::FileDescriptorProto*) override {
    return false;
  }

  int queries() const { return queries_; }
  std::string last_error() const { return last_error_; }

 private:
  bool lookup(const std::string& name, pb::FileDescriptorProto* output) const {
    auto it = files_.find(name);
    if (it == files_.end()) return false;
    *output = it->second;
    return true;
  }

  // Sends one request with the string field `field` = `value`; adds every returned file to
  // files_; *first_file = the name of the first one (the file that was asked for).
  bool fetch(const std::string& field, const std::string& value,
             std::string* first_file = nullptr) {
    auto resp = query(field, value, &last_error_);
    if (!resp) return false;
    const pb::Reflection* r = resp->GetReflection();
    const pb::FieldDescriptor* fd_resp =
        response_type_->FindFieldByName("file_descriptor_response");
    if (!r->HasField(*resp, fd_resp)) {
      last_error_ = field + " " + value + ": " + resp->ShortDebugString();
      return false;
    }
    const pb::Message& files = r->GetMessage(*resp, fd_resp);
    const pb::FieldDescriptor* protos =
        files.GetDescriptor()->FindFieldByName("file_descriptor_proto");
    const int n = files.GetReflection()->FieldSize(files, protos);
    for (int i = 0; i < n; ++i) {
      pb::FileDescriptorProto file;
      if (!file.ParseFromString(files.GetReflection()->GetRepeatedString(files, protos, i)))
        return false;
      if (i == 0 && first_file) *first_file = file.name();
      files_.emplace(file.name(), std::move(file));
    }
    return n > 0;
  }

  std::unique_ptr<pb::Message> query(const std::string& field, const std::string& value,
                                     std::string* error) {
    ++queries_;
    std::unique_ptr<pb::Message> req(factory_.GetPrototype(request_type_)->New());
    req->GetReflection()->SetString(req.get(), request_type_->FindFieldByName(field), value);
    std::string bytes;
    req->SerializeToString(&bytes);

    grpc::CompletionQueue cq;
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    auto call = stub_.PrepareCall(&ctx, kReflectionMethod, &cq);
    auto step = [&cq](void* want) {
      void* tag = nullptr;
      bool ok = false;
      const auto deadline = std::chrono::system_clock::now() + std::chrono::seconds(10);
      return cq.AsyncNext(&tag, &ok, deadline) == grpc::CompletionQueue::GOT_EVENT && tag == want &&
             ok;
    };
    grpc::Slice slice(bytes);
    grpc::ByteBuffer out(&slice, 1), in;
    grpc::Status status;
    int tags[5];
    bool ok = false;
    call->StartCall(&tags[0]);
    if (step(&tags[0])) {
      call->Write(out, &tags[1]);
      if (step(&tags[1])) {
        call->WritesDone(&tags[2]);
        if (step(&tags[2])) {
          call->Read(&in, &tags[3]);
          ok = step(&tags[3]);
        }
      }
    }
    call->Finish(&status, &tags[4]);
    (void)step(&tags[4]);
    cq.Shutdown();
    void* tag;
    bool drained;
    while (cq.Next(&tag, &drained)) {
    }
    if (!ok || !status.ok()) {
      *error = "reflection call failed: " + std::to_string(status.error_code()) + " " +
               status.error_message();
      return nullptr;
    }
    std::vector<grpc::Slice> slices;
    (void)in.Dump(&slices);
    std::string resp_bytes;
    for (const auto& s : slices)
      resp_bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
    std::unique_ptr<pb::Message> resp(factory_.GetPrototype(response_type_)->New());
    if (!resp->ParseFromString(resp_bytes)) {
      *error = "unparsable reflection response";
      return nullptr;
    }
    return resp;
  }

  grpc::GenericStub stub_;
  const pb::Descriptor* request_type_ = nullptr;
  const pb::Descriptor* response_type_ = nullptr;
  pb::DynamicMessageFactory factory_;
  std::map<std::string, pb::FileDescriptorProto> files_;
  std::string last_error_;
  int queries_ = 0;
};

// The production start path (start_grpc_server) on an in-process engine (synthetic model).
class ReflectionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    EngineConfig ec;  // synthetic:stories260k
    ec.kv_capacity_bytes = 8 << 20;
    auto engine = Engine::create(ec);
    ASSERT_TRUE(engine.ok()) << engine.status().to_string();
    engine_ = std::move(engine).value();
    service_ = std::make_unique<GenerationService>(engine_.get(), ServiceOptions{},
                                                   std::vector<SlaClass>{SlaClass{}});
    config::ServerConfig cfg;
    cfg.host = "127.0.0.1";
    cfg.port = 0;
    auto running = start_grpc_server(cfg, service_.get());
    ASSERT_TRUE(running.ok()) << running.status().to_string();
    server_ = std::move(running).value();
    channel_ = grpc::CreateChannel("127.0.0.1:" + std::to_string(server_.port),
                                   grpc::InsecureChannelCredentials());
  }
  void TearDown() override {
    if (server_.server)
      server_.server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
    server_.server.reset();
    if (engine_) engine_->shutdown(std::chrono::milliseconds(0));
  }

  std::unique_ptr<Engine> engine_;
  std::unique_ptr<GenerationService> service_;
  RunningServer server_;
  std::shared_ptr<grpc::Channel> channel_;
};

TEST_F(ReflectionTest, ListsServicesAndResolvesTypesWithoutTheProtoFile) {
  ReflectionDatabase db(channel_);
  ASSERT_TRUE(db.usable()) << "grpc.reflection.v1alpha descriptors not in the generated pool";
  std::string error;
  const std::vector<std::string> services = db.list_services(&error);
  ASSERT_FALSE(services.empty()) << error;
  auto has = [&](const std::string& s) {
    return std::find(services.begin(), services.end(), s) != services.end();
  };
  EXPECT_TRUE(has("kvsplit.v1.Generation"));
  EXPECT_TRUE(has("grpc.health.v1.Health"));
  EXPECT_TRUE(has("grpc.reflection.v1alpha.ServerReflection"));

  // A pool fed only by reflection (not the generated pool this binary compiled in).
  pb::DescriptorPool pool(&db);
  const pb::ServiceDescriptor* svc = pool.FindServiceByName("kvsplit.v1.Generation");
  ASSERT_NE(svc, nullptr) << db.last_error();
  EXPECT_NE(svc->file()->pool(), pb::DescriptorPool::generated_pool());
  const pb::MethodDescriptor* generate = svc->FindMethodByName("Generate");
  ASSERT_NE(generate, nullptr);
  EXPECT_TRUE(generate->server_streaming());
  EXPECT_FALSE(generate->client_streaming());
  for (const char* m : {"Abort", "GetModelInfo", "GetServerStats"})
    EXPECT_NE(svc->FindMethodByName(m), nullptr) << m;

  const pb::Descriptor* req = pool.FindMessageTypeByName("kvsplit.v1.GenerateRequest");
  ASSERT_NE(req, nullptr) << db.last_error();
  EXPECT_EQ(generate->input_type(), req);
  // Field layout matches what this binary was compiled with, field by field.
  const pb::Descriptor* compiled = v1::GenerateRequest::descriptor();
  ASSERT_EQ(req->field_count(), compiled->field_count());
  for (int i = 0; i < compiled->field_count(); ++i) {
    const pb::FieldDescriptor* f = req->FindFieldByName(compiled->field(i)->name());
    ASSERT_NE(f, nullptr) << compiled->field(i)->name();
    EXPECT_EQ(f->number(), compiled->field(i)->number()) << f->name();
    EXPECT_EQ(f->type(), compiled->field(i)->type()) << f->name();
  }
  ASSERT_NE(req->FindFieldByName("prompt"), nullptr);
  EXPECT_NE(req->FindFieldByName("prompt")->containing_oneof(), nullptr);
  const pb::FieldDescriptor* sampling = req->FindFieldByName("sampling");
  ASSERT_NE(sampling, nullptr);
  ASSERT_NE(sampling->message_type(), nullptr);
  EXPECT_NE(sampling->message_type()->FindFieldByName("temperature"), nullptr);
  EXPECT_GT(db.queries(), 1);

  // An unknown symbol is a clean miss, not a hang or crash.
  EXPECT_EQ(pool.FindMessageTypeByName("kvsplit.v1.NoSuchMessage"), nullptr);
}

}  // namespace
}  // namespace kvsplit::server
