// Client over gRPC (see client.h). grpc::Status → traind::Status is mapped in FromGrpc only.
#include "traind/client/client.h"

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "grpc/health/v1/health.grpc.pb.h"
#include "traind/v1/job_service.grpc.pb.h"

namespace traind::client {
namespace {

Status FromGrpc(const grpc::Status& s) {
  using C = grpc::StatusCode;
  const std::string& m = s.error_message();
  switch (s.error_code()) {
    case C::OK: return Status::Ok();
    case C::INVALID_ARGUMENT: return Status::InvalidArgument(m);
    case C::NOT_FOUND: return Status::NotFound(m);
    case C::FAILED_PRECONDITION: return Status::FailedPrecondition(m);
    case C::RESOURCE_EXHAUSTED: return Status::ResourceExhausted(m);
    case C::DATA_LOSS: return Status::DataLoss(m);
    case C::CANCELLED: return Status::Cancelled(m);
    case C::UNIMPLEMENTED: return Status::Unimplemented(m);
    case C::UNAUTHENTICATED: return Status::Unauthenticated(m);
    case C::PERMISSION_DENIED: return Status::PermissionDenied(m);
    case C::UNAVAILABLE:
    case C::DEADLINE_EXCEEDED: return Status::Unavailable(m.empty() ? "traind did not answer" : m);
    default: return Status::Internal(m);
  }
}

}  // namespace

Result<std::string> ReadFile(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return Status::NotFound("cannot read " + path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

struct Client::Impl {
  ClientOptions options;
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<v1::JobService::Stub> stub;
  std::unique_ptr<grpc::health::v1::Health::Stub> health;
  // The traind answered WatchJobEvents with UNIMPLEMENTED (it predates it): WatchJob from then on.
  std::atomic<bool> events_unbatched{false};

  void Prepare(grpc::ClientContext* ctx, bool deadline) const {
    if (!options.token.empty()) ctx->AddMetadata("authorization", "Bearer " + options.token);
    if (deadline)
      ctx->set_deadline(std::chrono::system_clock::now() +
                        std::chrono::milliseconds(static_cast<int64_t>(options.timeout_seconds * 1000)));
  }
};

Client::Client(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Client::~Client() = default;

Result<std::unique_ptr<Client>> Client::Create(const ClientOptions& options) {
  auto impl = std::make_unique<Impl>();
  impl->options = options;
  std::shared_ptr<grpc::ChannelCredentials> creds = grpc::InsecureChannelCredentials();
  if (options.tls) {
    grpc::SslCredentialsOptions ssl;
    if (!options.tls_ca_file.empty()) {
      TRAIND_ASSIGN_OR_RETURN(ssl.pem_root_certs, ReadFile(options.tls_ca_file));
    }
    creds = grpc::SslCredentials(ssl);
  }
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(64 << 20);
  // No BDP probes: each is a PING traind must read and answer (a wake-up and a write of the
  // daemon's per call of a client that polls); the control plane's messages are small.
  args.SetInt(GRPC_ARG_HTTP2_BDP_PROBE, 0);
  if (options.own_connection) args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  impl->channel = grpc::CreateCustomChannel(options.addr, creds, args);
  impl->stub = v1::JobService::NewStub(impl->channel);
  impl->health = grpc::health::v1::Health::NewStub(impl->channel);
  return std::unique_ptr<Client>(new Client(std::move(impl)));
}

Result<v1::Job> Client::SubmitFile(const std::string& path, int32_t priority) {
  TRAIND_ASSIGN_OR_RETURN(std::string text, ReadFile(path));
  v1::SubmitJobRequest req;
  req.set_spec_yaml(text);
  req.set_base_dir(std::filesystem::current_path().string());  // paths as the user typed them: relative to the working directory
  req.set_priority(priority);
  return Submit(req);
}

Result<v1::Job> Client::Submit(const v1::SubmitJobRequest& request) {
  grpc::ClientContext ctx;
  impl_->Prepare(&ctx, true);
  v1::SubmitJobResponse resp;
  TRAIND_RETURN_IF_ERROR(FromGrpc(impl_->stub->SubmitJob(&ctx, request, &resp)));
  return resp.job();
}

Result<v1::Job> Client::Get(const std::string& id) {
  grpc::ClientContext ctx;
  impl_->Prepare(&ctx, true);
  v1::GetJobRequest req;
  req.set_id(id);
  v1::Job job;
  TRAIND_RETURN_IF_ERROR(FromGrpc(impl_->stub->GetJob(&ctx, req, &job)));
  return job;
}

Result<std::vector<v1::Job>> Client::List(int limit) {
  grpc::ClientContext ctx;
  impl_->Prepare(&ctx, true);
  v1::ListJobsRequest req;
  req.set_limit(limit);
  v1::ListJobsResponse resp;
  TRAIND_RETURN_IF_ERROR(FromGrpc(impl_->stub->ListJobs(&ctx, req, &resp)));
  return std::vector<v1::Job>(resp.jobs().begin(), resp.jobs().end());
}

Result<v1::Job> Client::Cancel(const std::string& id) {
  grpc::ClientContext ctx;
  impl_->Prepare(&ctx, true);
  v1::CancelJobRequest req;
  req.set_id(id);
  v1::Job job;
  TRAIND_RETURN_IF_ERROR(FromGrpc(impl_->stub->CancelJob(&ctx, req, &job)));
  return job;
}

Result<v1::EstimateJobResponse> Client::EstimateFile(const std::string& path) {
  TRAIND_ASSIGN_OR_RETURN(std::string text, ReadFile(path));
  v1::EstimateJobRequest req;
  req.set_spec_yaml(text);
  req.set_base_dir(std::filesystem::current_path().string());  // paths as the user typed them: relative to the working directory
  return Estimate(req);
}

Result<v1::EstimateJobResponse> Client::Estimate(const v1::EstimateJobRequest& request) {
  grpc::ClientContext ctx;
  impl_->Prepare(&ctx, true);
  v1::EstimateJobResponse resp;
  TRAIND_RETURN_IF_ERROR(FromGrpc(impl_->stub->EstimateJob(&ctx, request, &resp)));
  return resp;
}

Result<v1::GenerateResponse> Client::Generate(v1::GenerateRequest request) {
  if (!request.output_dir().empty() && request.output_dir()[0] != '/') {
    request.set_output_dir((std::filesystem::current_path() / request.output_dir()).string());
  }
  const std::string& tok = request.tokenizer();
  if (!tok.empty() && tok != "byte" && tok[0] != '/') {
    request.set_tokenizer((std::filesystem::current_path() / tok).string());
  }
  grpc::ClientContext ctx;
  impl_->Prepare(&ctx, false);
  const double seconds = std::max(impl_->options.timeout_seconds, 660.0);
  ctx.set_deadline(std::chrono::system_clock::now() +
                   std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000)));
  v1::GenerateResponse resp;
  TRAIND_RETURN_IF_ERROR(FromGrpc(impl_->stub->Generate(&ctx, request, &resp)));
  return resp;
}

Status Client::Watch(const std::string& id, int64_t from_sequence, bool follow,
                     const std::function<bool(const v1::JobEvent&)>& on_event, double reconnect_seconds) {
  int64_t next = from_sequence;
  auto give_up = std::chrono::steady_clock::now();
  bool retrying = false;
  while (true) {
    grpc::ClientContext ctx;
    impl_->Prepare(&ctx, false);
    v1::WatchJobRequest req;
    req.set_id(id);
    req.set_from_sequence(next);
    req.set_follow(follow);
    bool stopped = false;
    grpc::Status s;
    if (!impl_->events_unbatched) {
      // Batches (WatchJobEvents); a traind from before them answers UNIMPLEMENTED: one by one.
      auto reader = impl_->stub->WatchJobEvents(&ctx, req);
      v1::JobEventBatch batch;
      bool any = false;
      while (!stopped && reader->Read(&batch)) {
        any = true;
        retrying = false;
        for (const v1::JobEvent& ev : batch.events()) {
          next = ev.sequence() + 1;
          if (!on_event(ev)) {
            stopped = true;
            ctx.TryCancel();
            break;
          }
        }
      }
      s = reader->Finish();
      if (stopped) return Status::Ok();
      if (!any && s.error_code() == grpc::StatusCode::UNIMPLEMENTED) {
        impl_->events_unbatched = true;
        continue;
      }
    } else {
      auto reader = impl_->stub->WatchJob(&ctx, req);
      v1::JobEvent ev;
      while (reader->Read(&ev)) {
        retrying = false;
        next = ev.sequence() + 1;
        if (!on_event(ev)) {
          stopped = true;
          ctx.TryCancel();
          break;
        }
      }
      s = reader->Finish();
      if (stopped) return Status::Ok();
    }
    Status st = FromGrpc(s);
    if (st.ok() || !follow || st.code() != Status::Code::kUnavailable) return st;
    // traind went away: retry until reconnect_seconds have passed since the last event.
    if (!retrying) {
      retrying = true;
      give_up = std::chrono::steady_clock::now() +
                std::chrono::milliseconds(static_cast<int64_t>(reconnect_seconds * 1000));
    }
    if (std::chrono::steady_clock::now() > give_up) return st;
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
  }
}

Status Client::Health() {
  grpc::ClientContext ctx;
  impl_->Prepare(&ctx, true);
  grpc::health::v1::HealthCheckRequest req;
  grpc::health::v1::HealthCheckResponse resp;
  TRAIND_RETURN_IF_ERROR(FromGrpc(impl_->health->Check(&ctx, req, &resp)));
  if (resp.status() != grpc::health::v1::HealthCheckResponse::SERVING)
    return Status::Unavailable("traind is not serving (health status " + std::to_string(resp.status()) + ")");
  return Status::Ok();
}

}  // namespace traind::client
