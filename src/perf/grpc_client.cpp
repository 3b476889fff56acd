// kiln perf's gRPC client: the stub generated from kiln serve's grpc_predict_v2.proto, a
// channel (and so a connection) of its own per client, tensors in raw_input_contents or as
// Triton's shared memory parameters, every call bounded by the request timeout.
#include <fmt/format.h>
#include <grpcpp/grpcpp.h>

#include <chrono>

#include "grpc_predict_v2.grpc.pb.h"
#include "perf/client.h"

namespace kiln::perf {
namespace {

using inference::GRPCInferenceService;

class GrpcClient : public Client {
 public:
  GrpcClient(const Endpoint& at, int timeout_ms) : at_(at), timeout_ms_(timeout_ms) {
    grpc::ChannelArguments args;
    args.SetMaxReceiveMessageSize(-1);
    args.SetMaxSendMessageSize(-1);
    // A connection per client, as Triton's clients open one each: without this, channels to
    // the same address share one subchannel, and every client one HTTP/2 connection.
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    channel_ = grpc::CreateCustomChannel(at.text(), grpc::InsecureChannelCredentials(), args);
    stub_ = GRPCInferenceService::NewStub(channel_);
  }

  Status connect() {
    grpc::ClientContext ctx;
    deadline(ctx);
    inference::ServerLiveRequest req;
    inference::ServerLiveResponse res;
    const grpc::Status st = stub_->ServerLive(&ctx, req, &res);
    if (!st.ok())
      return KILN_ERROR("cannot reach kiln serve at {} over gRPC: {} (is the server up?)",
                        at_.text(), st.error_message());
    return Status::Ok();
  }

  Expected<ModelMeta> metadata(const std::string& model, const std::string& version) override {
    grpc::ClientContext ctx;
    deadline(ctx);
    inference::ModelMetadataRequest req;
    req.set_name(model);
    req.set_version(version);
    inference::ModelMetadataResponse res;
    const grpc::Status st = stub_->ModelMetadata(&ctx, req, &res);
    if (!st.ok()) return KILN_ERROR("model '{}': {}", model, describe(st));
    ModelMeta meta;
    meta.name = model;
    auto tensors = [](const auto& list, std::vector<TensorMeta>& out) {
      for (const auto& t : list)
        out.push_back({t.name(), t.datatype(), {t.shape().begin(), t.shape().end()}});
    };
    tensors(res.inputs(), meta.inputs);
    tensors(res.outputs(), meta.outputs);
    return meta;
  }

  Status register_shm(const std::string& name, const std::string& key, uint64_t size) override {
    grpc::ClientContext ctx;
    deadline(ctx);
    inference::SystemSharedMemoryRegisterRequest req;
    req.set_name(name);
    req.set_key(key);
    req.set_offset(0);
    req.set_byte_size(size);
    inference::SystemSharedMemoryRegisterResponse res;
    const grpc::Status st = stub_->SystemSharedMemoryRegister(&ctx, req, &res);
    if (!st.ok())
      return KILN_ERROR("registering shared memory region '{}': {}", name, describe(st));
    return Status::Ok();
  }

  Status unregister_shm(const std::string& name) override {
    grpc::ClientContext ctx;
    deadline(ctx);
    inference::SystemSharedMemoryUnregisterRequest req;
    req.set_name(name);
    inference::SystemSharedMemoryUnregisterResponse res;
    const grpc::Status st = stub_->SystemSharedMemoryUnregister(&ctx, req, &res);
    if (!st.ok())
      return KILN_ERROR("unregistering shared memory region '{}': {}", name, describe(st));
    return Status::Ok();
  }

  Status prepare(const RequestPlan& plan, const ShmLayout* shm) override {
    req_.Clear();
    req_.set_model_name(plan.model);
    req_.set_model_version(plan.version);
    auto shm_params = [&](auto* params, uint64_t offset, uint64_t bytes) {
      (*params)["shared_memory_region"].set_string_param(shm->region);
      (*params)["shared_memory_offset"].set_int64_param(static_cast<int64_t>(offset));
      (*params)["shared_memory_byte_size"].set_int64_param(static_cast<int64_t>(bytes));
    };
    for (size_t i = 0; i < plan.inputs.size(); ++i) {
      const InputPlan& in = plan.inputs[i];
      auto* t = req_.add_inputs();
      t->set_name(in.tensor.name);
      t->set_datatype(in.tensor.datatype);
      for (int64_t d : in.tensor.shape) t->add_shape(d);
      if (shm)
        shm_params(t->mutable_parameters(), shm->input_offsets[i], in.data.size());
      else
        req_.add_raw_input_contents(in.data);
    }
    for (size_t i = 0; i < plan.outputs.size(); ++i) {
      auto* o = req_.add_outputs();
      o->set_name(plan.outputs[i].name);
      if (shm) shm_params(o->mutable_parameters(), shm->output_offsets[i], plan.outputs[i].bytes);
    }
    shm_ = shm != nullptr;
    return Status::Ok();
  }

  Status infer() override {
    grpc::ClientContext ctx;
    deadline(ctx);
    res_.Clear();
    const grpc::Status st = stub_->ModelInfer(&ctx, req_, &res_);
    if (!st.ok()) return Status::Error(describe(st));
    if (res_.outputs_size() != req_.outputs_size())
      return KILN_ERROR("the answer has {} outputs, not the {} asked for", res_.outputs_size(),
                        req_.outputs_size());
    // One raw_output_contents per output, by place (Triton's clients index it so); empty for
    // an output written to shared memory.
    if (res_.raw_output_contents_size() != res_.outputs_size())
      return KILN_ERROR("the answer has {} raw output contents for {} outputs",
                        res_.raw_output_contents_size(), res_.outputs_size());
    if (shm_)
      for (const std::string& raw : res_.raw_output_contents())
        if (!raw.empty())
          return KILN_ERROR("the answer holds {} bytes of an output asked for in shared memory",
                            raw.size());
    return Status::Ok();
  }

 private:
  void deadline(grpc::ClientContext& ctx) const {
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(timeout_ms_));
  }
  static std::string describe(const grpc::Status& st) {
    static const char* kNames[] = {"OK",
                                   "CANCELLED",
                                   "UNKNOWN",
                                   "INVALID_ARGUMENT",
                                   "DEADLINE_EXCEEDED",
                                   "NOT_FOUND",
                                   "ALREADY_EXISTS",
                                   "PERMISSION_DENIED",
                                   "RESOURCE_EXHAUSTED",
                                   "FAILED_PRECONDITION",
                                   "ABORTED",
                                   "OUT_OF_RANGE",
                                   "UNIMPLEMENTED",
                                   "INTERNAL",
                                   "UNAVAILABLE",
                                   "DATA_LOSS",
                                   "UNAUTHENTICATED"};
    const int code = static_cast<int>(st.error_code());
    return fmt::format("gRPC {}: {}", code >= 0 && code <= 16 ? kNames[code] : "?",
                       st.error_message());
  }

  Endpoint at_;
  int timeout_ms_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<GRPCInferenceService::Stub> stub_;
  inference::ModelInferRequest req_;
  inference::ModelInferResponse res_;
  bool shm_ = false;
};

}  // namespace

Expected<std::unique_ptr<Client>> connect_grpc(const Endpoint& at, int timeout_ms) {
  auto c = std::make_unique<GrpcClient>(at, timeout_ms);
  KILN_RETURN_IF_ERROR(c->connect());
  return std::unique_ptr<Client>(std::move(c));
}

}  // namespace kiln::perf
