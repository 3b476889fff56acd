#include "serve/grpc_server.h"

#include <grpcpp/grpcpp.h>
#include <grpcpp/support/proto_buffer_reader.h>

#include <chrono>
#include <cstdio>

#include "grpc_predict_v2.grpc.pb.h"
#include "serve/grpc_codec.h"

namespace kiln::serve {
namespace {

namespace pb = inference;
using grpc::CallbackServerContext;
using grpc::ServerUnaryReactor;

grpc::Status to_status(const ApiError& e) {
  return grpc::Status(static_cast<grpc::StatusCode>(grpc_code(e.status)), e.message);
}

using Base = pb::GRPCInferenceService::WithRawCallbackMethod_ModelInfer<
    pb::GRPCInferenceService::CallbackService>;

class Service final : public Base {
 public:
  Service(Core& core, bool log) : core_(core), log_(log) {}

  ServerUnaryReactor* ServerLive(CallbackServerContext* ctx, const pb::ServerLiveRequest*,
                                 pb::ServerLiveResponse* res) override {
    res->set_live(true);
    return done(ctx, "ServerLive", grpc::Status::OK);
  }
  ServerUnaryReactor* ServerReady(CallbackServerContext* ctx, const pb::ServerReadyRequest*,
                                  pb::ServerReadyResponse* res) override {
    res->set_ready(core_.ready());
    return done(ctx, "ServerReady", grpc::Status::OK);
  }
  ServerUnaryReactor* ModelReady(CallbackServerContext* ctx, const pb::ModelReadyRequest* req,
                                 pb::ModelReadyResponse* res) override {
    auto e = core_.find(req->name(), req->version());
    if (!e.ok()) return done(ctx, "ModelReady", to_status(e.error()));
    res->set_ready(core_.ready());
    return done(ctx, "ModelReady", grpc::Status::OK);
  }
  ServerUnaryReactor* ServerMetadata(CallbackServerContext* ctx, const pb::ServerMetadataRequest*,
                                     pb::ServerMetadataResponse* res) override {
    res->set_name("kiln");
    res->set_version(KILN_VERSION_STRING);
    for (const char* x : {"binary_tensor_data", "system_shared_memory", "cuda_shared_memory",
                          "schedule_policy", "model_configuration"})
      res->add_extensions(x);
    return done(ctx, "ServerMetadata", grpc::Status::OK);
  }
  ServerUnaryReactor* ModelMetadata(CallbackServerContext* ctx, const pb::ModelMetadataRequest* req,
                                    pb::ModelMetadataResponse* res) override {
    auto e = core_.find(req->name(), req->version());
    if (!e.ok()) return done(ctx, "ModelMetadata", to_status(e.error()));
    const ServedModel& m = *(*e)->model;
    res->set_name(m.name());
    for (const std::string& v : core_.versions(m.name())) res->add_versions(v);
    res->set_platform("kiln");
    auto add = [](auto* list, const std::vector<TensorInfo>& ts) {
      for (const TensorInfo& t : ts) {
        auto* x = list->Add();
        x->set_name(t.name);
        x->set_datatype(std::string(v2_datatype(t.dtype)));
        for (int64_t d : t.dims) x->add_shape(d);
      }
    };
    add(res->mutable_inputs(), m.engine().inputs());
    add(res->mutable_outputs(), m.outputs());
    return done(ctx, "ModelMetadata", grpc::Status::OK);
  }
  ServerUnaryReactor* RepositoryIndex(CallbackServerContext* ctx, const pb::RepositoryIndexRequest*,
                                      pb::RepositoryIndexResponse* res) override {
    for (const auto& [name, versions] : core_.models())
      for (const auto& [v, e] : versions) {
        auto* m = res->add_models();
        m->set_name(name);
        m->set_version(std::to_string(v));
        m->set_state("READY");
      }
    return done(ctx, "RepositoryIndex", grpc::Status::OK);
  }
  ServerUnaryReactor* SystemSharedMemoryStatus(CallbackServerContext* ctx,
                                               const pb::SystemSharedMemoryStatusRequest* req,
                                               pb::SystemSharedMemoryStatusResponse* res) override {
    auto st = core_.shm().status(req->name());
    if (!st.ok()) return done(ctx, "SystemSharedMemoryStatus", to_status(st.error()));
    for (const RegionStatus& r : *st) {
      auto& x = (*res->mutable_regions())[r.name];
      x.set_name(r.name);
      x.set_key(r.key);
      x.set_offset(r.offset);
      x.set_byte_size(r.byte_size);
    }
    return done(ctx, "SystemSharedMemoryStatus", grpc::Status::OK);
  }
  ServerUnaryReactor* SystemSharedMemoryRegister(CallbackServerContext* ctx,
                                                 const pb::SystemSharedMemoryRegisterRequest* req,
                                                 pb::SystemSharedMemoryRegisterResponse*) override {
    Check c = core_.shm().register_region(req->name(), req->key(), req->offset(), req->byte_size());
    return done(ctx, "SystemSharedMemoryRegister", c ? to_status(*c) : grpc::Status::OK);
  }
  ServerUnaryReactor* SystemSharedMemoryUnregister(
      CallbackServerContext* ctx, const pb::SystemSharedMemoryUnregisterRequest* req,
      pb::SystemSharedMemoryUnregisterResponse*) override {
    core_.shm().unregister(req->name());
    return done(ctx, "SystemSharedMemoryUnregister", grpc::Status::OK);
  }
  ServerUnaryReactor* CudaSharedMemoryStatus(CallbackServerContext* ctx,
                                             const pb::CudaSharedMemoryStatusRequest* req,
                                             pb::CudaSharedMemoryStatusResponse* res) override {
    auto st = core_.shm().status(req->name(), true);
    if (!st.ok()) return done(ctx, "CudaSharedMemoryStatus", to_status(st.error()));
    for (const RegionStatus& r : *st) {
      auto& x = (*res->mutable_regions())[r.name];
      x.set_name(r.name);
      x.set_device_id(r.device_id);
      x.set_byte_size(r.byte_size);
    }
    return done(ctx, "CudaSharedMemoryStatus", grpc::Status::OK);
  }
  ServerUnaryReactor* CudaSharedMemoryRegister(CallbackServerContext* ctx,
                                               const pb::CudaSharedMemoryRegisterRequest* req,
                                               pb::CudaSharedMemoryRegisterResponse*) override {
    Check c = core_.shm().register_cuda_region(req->name(), req->raw_handle(), req->device_id(),
                                               req->byte_size());
    return done(ctx, "CudaSharedMemoryRegister", c ? to_status(*c) : grpc::Status::OK);
  }
  ServerUnaryReactor* CudaSharedMemoryUnregister(CallbackServerContext* ctx,
                                                 const pb::CudaSharedMemoryUnregisterRequest* req,
                                                 pb::CudaSharedMemoryUnregisterResponse*) override {
    core_.shm().unregister(req->name(), true);
    return done(ctx, "CudaSharedMemoryUnregister", grpc::Status::OK);
  }

  ServerUnaryReactor* ModelInfer(CallbackServerContext* ctx, const grpc::ByteBuffer* body,
                                 grpc::ByteBuffer* response) override {
    auto* reactor = ctx->DefaultReactor();
    auto msg = std::make_shared<pb::ModelInferRequest>();
    // Parsed from gRPC's slices as they are (no copy of the whole message into one first); the
    // bytes are gathered only to say why a message does not parse.
    grpc::ByteBuffer view(*body);  // shares the slices: the reader consumes its own copy
    grpc::ProtoBufferReader reader(&view);
    if (!reader.status().ok() || !msg->ParseFromZeroCopyStream(&reader)) {
      grpc::Slice slice;
      const bool dumped = body->DumpToSingleSlice(&slice).ok();
      finish(reactor, "ModelInfer",
             to_status({400, fmt::format("malformed request: {}",
                                         dumped ? why_not_a_message(slice.begin(), slice.size())
                                                : std::string("the message cannot be read"))}));
      return reactor;
    }
    auto decoded = decode_grpc_infer(msg, core_.shm());
    if (!decoded.ok()) {
      finish(reactor, "ModelInfer", to_status(decoded.error()));
      return reactor;
    }
    InferRequest req = std::move(decoded).value();
    // The client's deadline bounds the time in the queue as the timeout parameter does; a call
    // the client cancelled (or whose connection closed) is dropped from the queue.
    const auto client_deadline = ctx->deadline();
    if (client_deadline != std::chrono::system_clock::time_point::max()) {
      const auto left = client_deadline - std::chrono::system_clock::now();
      const auto at = std::chrono::steady_clock::now() +
                      std::chrono::duration_cast<std::chrono::steady_clock::duration>(left);
      if (!req.deadline || at < *req.deadline) req.deadline = at;
    }
    req.cancelled = [ctx] { return ctx->IsCancelled(); };
    // Answered from the batcher's worker thread: the response is encoded there and the call
    // finished, with no thread of gRPC's waiting meanwhile.
    core_.infer(
        std::move(req), [this, reactor, response](InferRequest& req, Result<Outputs> outputs) {
          if (!outputs.ok()) return finish(reactor, "ModelInfer", to_status(outputs.error()));
          auto entry = core_.find(req.model, req.version);
          pb::ModelInferResponse r;
          std::vector<Tensor> raw;
          Check c = encode_grpc_infer(req, *(*entry)->model, *outputs, core_.shm(), &r, &raw);
          if (c) return finish(reactor, "ModelInfer", to_status(*c));
          // The outputs' bytes go to gRPC where they are (a batch's outputs, two copies of
          // BERT's 393 KB a request on the batcher's thread before).
          *response = infer_response_buffer(r, std::move(raw));
          finish(reactor, "ModelInfer", grpc::Status::OK);
        });
    return reactor;
  }

 private:
  ServerUnaryReactor* done(CallbackServerContext* ctx, const char* method, const grpc::Status& st) {
    auto* r = ctx->DefaultReactor();
    finish(r, method, st);
    return r;
  }
  void finish(ServerUnaryReactor* r, const char* method, const grpc::Status& st) {
    core_.count_response("grpc", st.ok() ? 200 : 400 + static_cast<int>(st.error_code()));
    if (log_)
      std::fprintf(stderr, "kiln serve: grpc method: /inference.GRPCInferenceService/%s %s\n",
                   method, st.ok() ? "OK" : st.error_message().c_str());
    r->Finish(st);
  }

  Core& core_;
  bool log_;
};

}  // namespace

struct GrpcServer::Impl {
  Core& core;
  GrpcOptions opts;
  std::unique_ptr<Service> service;
  std::unique_ptr<grpc::Server> server;
};

GrpcServer::GrpcServer(Core& core, GrpcOptions options)
    : impl_(std::make_unique<Impl>(Impl{core, std::move(options), nullptr, nullptr})) {}

GrpcServer::~GrpcServer() { stop(); }

Status GrpcServer::start() {
  Impl& s = *impl_;
  s.service = std::make_unique<Service>(s.core, s.opts.log_requests);
  grpc::ServerBuilder b;
  const std::string address = s.opts.host.find(':') != std::string::npos
                                  ? fmt::format("[{}]:{}", s.opts.host, s.opts.port)
                                  : fmt::format("{}:{}", s.opts.host, s.opts.port);
  int bound = 0;
  b.AddListeningPort(address, grpc::InsecureServerCredentials(), &bound);
  const int limit = static_cast<int>(std::min<size_t>(s.opts.max_request_bytes, INT32_MAX));
  b.SetMaxReceiveMessageSize(limit);
  b.SetMaxSendMessageSize(INT32_MAX);
  // One process listens on a port: a second server must fail to start, not share it.
  b.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  b.RegisterService(s.service.get());
  s.server = b.BuildAndStart();
  if (!s.server || bound == 0)
    return KILN_ERROR(
        "cannot listen on {} (gRPC): the port is taken or the address is not this "
        "machine's",
        address);
  return Status::Ok();
}

void GrpcServer::stop() {
  if (impl_->server) {
    impl_->server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(30));
    impl_->server.reset();
  }
}

}  // namespace kiln::serve
