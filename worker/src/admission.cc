// Admission checks and engine <-> proto conversions (see admission.h).
#include "traind/worker/admission.h"

#include <google/protobuf/descriptor.h>
#include <google/protobuf/reflection.h>

#include <nlohmann/json.hpp>

#if TRAIND_HAVE_GLOO
#include "traind/comm/distributed.h"
#include "traind/engine/devices.h"
#endif

namespace traind::worker {
namespace {

using google::protobuf::FieldDescriptor;
using google::protobuf::Message;

// Every set field of `m` as a JSON value of the right type (reflection, so new proto fields need
// no code here).
nlohmann::json ToJson(const Message& m) {
  nlohmann::json j = nlohmann::json::object();
  const auto* refl = m.GetReflection();
  std::vector<const FieldDescriptor*> fields;
  refl->ListFields(m, &fields);
  for (const FieldDescriptor* f : fields) {
    const std::string& name = f->name();
    if (name == "per_device_train_batch_size_auto") {
      if (refl->GetBool(m, f)) j["per_device_train_batch_size"] = "auto";
      continue;
    }
    if (f->is_repeated()) {
      nlohmann::json arr = nlohmann::json::array();
      for (int i = 0; i < refl->FieldSize(m, f); ++i) {
        if (f->cpp_type() == FieldDescriptor::CPPTYPE_STRING) arr.push_back(refl->GetRepeatedString(m, f, i));
      }
      j[name] = arr;
      continue;
    }
    switch (f->cpp_type()) {
      case FieldDescriptor::CPPTYPE_INT64: j[name] = refl->GetInt64(m, f); break;
      case FieldDescriptor::CPPTYPE_INT32: j[name] = refl->GetInt32(m, f); break;
      case FieldDescriptor::CPPTYPE_DOUBLE: j[name] = refl->GetDouble(m, f); break;
      case FieldDescriptor::CPPTYPE_BOOL: j[name] = refl->GetBool(m, f); break;
      case FieldDescriptor::CPPTYPE_STRING: j[name] = refl->GetString(m, f); break;
      case FieldDescriptor::CPPTYPE_MESSAGE: j[name] = ToJson(refl->GetMessage(m, f)); break;
      default: break;
    }
  }
  return j;
}

}  // namespace

std::string SpecMessageToText(const v1::JobSpec& spec) { return ToJson(spec).dump(); }

int64_t DistributedWorld(const engine::JobSpec& spec) {
  if (!spec.distributed.has_value() || !spec.distributed->world_size.has_value()) return 0;
  return *spec.distributed->world_size > 1 ? *spec.distributed->world_size : 0;
}

int64_t DistributedRank(const engine::JobSpec& spec) {
  if (DistributedWorld(spec) == 0 || !spec.distributed->rank.has_value()) return -1;
  return *spec.distributed->rank;
}

Status CheckDistributedDevice(const engine::JobSpec& spec, const std::string& device) {
  if (DistributedWorld(spec) == 0) return Status::Ok();
  // The registry's capabilities of the device (no backend is open here).
  TRAIND_ASSIGN_OR_RETURN(engine::DeviceCapabilities caps, engine::DeviceCapabilitiesOf(device));
  if (!caps.has_own_memory) return Status::Ok();  // host memory: Gloo reduces it
  if (!caps.data_parallel()) {
    return Status::Unimplemented(
        "distributed: data parallel on " + device +
        " is not supported: no communicator reduces its memory (NCCL needs a CUDA device, Gloo "
        "host memory; start the daemons with --device cpu for Gloo, or cuda:N for NCCL)");
  }
#if TRAIND_HAVE_GLOO
  const bool nccl = comm::NcclBuilt();
#else
  const bool nccl = false;
#endif
  if (nccl && caps.device_collective == "nccl") return Status::Ok();
  return Status::Unimplemented(
      "distributed: data parallel on " + device +
      " is not supported by this build (NCCL is not built: it comes with the CUDA backend; Gloo "
      "on the cpu backend only: start the daemons with --device cpu)");
}

Result<Admitted> Admit(const std::string& text, const std::string& base_dir,
                       const engine::DeviceOptions& device) {
  TRAIND_ASSIGN_OR_RETURN(engine::JobSpec spec, engine::ParseJobSpec(text, base_dir));
  // Data parallel through the daemon (trainctl submit --hosts, docs/distributed.md): one job per
  // daemon, one rank each; the rank and world must be in the spec (a daemon's environment is not
  // a rank's).
  if (spec.distributed.has_value() &&
      !(spec.distributed->world_size.has_value() && *spec.distributed->world_size == 1)) {
    if (!spec.distributed->world_size.has_value()) {
      return Status::InvalidArgument(
          "distributed.world_size: must be set in a job submitted to traind (trainctl submit --hosts "
          "sets it; WORLD_SIZE is read by `traind run` only)");
    }
    if (!spec.distributed->rank.has_value()) {
      return Status::InvalidArgument(
          "distributed.rank: must be set in a job submitted to traind (trainctl submit --hosts "
          "sets it; RANK is read by `traind run` only)");
    }
  }
  TRAIND_RETURN_IF_ERROR(engine::ValidateJobInputs(spec));
  TRAIND_ASSIGN_OR_RETURN(engine::MemoryPlan plan, engine::EstimateJob(spec, device));
  // A new job never replaces another run's results silently (overwrite_output_dir says it may).
  // A data-parallel rank other than 0 writes nothing to output_dir: not checked there.
  if (DistributedRank(spec) <= 0) TRAIND_RETURN_IF_ERROR(engine::CheckOutputDirFree(spec));
  Admitted a;
  a.spec_json = engine::JobSpecToJson(spec);
  a.spec = std::move(spec);
  a.plan = std::move(plan);
  return a;
}

Result<engine::MemoryPlan> Estimate(const std::string& text, const std::string& base_dir,
                                    const engine::DeviceOptions& device) {
  TRAIND_ASSIGN_OR_RETURN(engine::JobSpec spec, engine::ParseJobSpec(text, base_dir));
  return engine::EstimateJobWithAdvice(spec, device);
}

v1::Plan PlanToProto(const engine::MemoryPlan& p) {
  v1::Plan out;
  out.set_micro_batch(p.micro_batch);
  out.set_gradient_accumulation_steps(p.gradient_accumulation_steps);
  out.set_gradient_checkpointing(p.gradient_checkpointing);
  out.set_precision(p.precision);
  out.set_optimizer(p.optimizer);
  out.set_trainable_params(p.trainable_params);
  out.set_total_params(p.total_params);
  out.set_offload(p.offload);
  out.set_offload_state_bytes(p.offload_state_bytes);
  out.set_offload_master_bytes(p.offload_master_bytes);
  out.set_quantized_base_bytes(p.quantized_base_bytes);
  out.set_quantized_base_params(p.quantized_base_params);
  auto* b = out.mutable_bytes();
  b->set_weights(p.bytes.weights);
  b->set_gradients(p.bytes.gradients);
  b->set_optimizer(p.bytes.optimizer);
  b->set_activations(p.bytes.activations);
  b->set_temporary(p.bytes.temporary);
  b->set_total(p.bytes.total());
  out.set_budget_bytes(p.budget_bytes);
  out.set_reason(p.reason);
  return out;
}

v1::RunSummary SummaryToProto(const engine::RunSummary& s) {
  v1::RunSummary out;
  out.set_global_step(s.global_step);
  out.set_train_loss(s.train_loss);
  out.set_eval_loss(s.eval_loss);
  if (s.eval_accuracy) out.set_eval_accuracy(*s.eval_accuracy);
  out.set_train_runtime(s.train_runtime);
  out.set_train_samples_per_second(s.train_samples_per_second);
  out.set_train_tokens_per_second(s.train_tokens_per_second);
  out.set_peak_memory_bytes(s.peak_memory_bytes);
  out.set_output_dir(s.output_dir);
  return out;
}

}  // namespace traind::worker
