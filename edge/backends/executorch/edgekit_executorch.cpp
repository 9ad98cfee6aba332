// A C interface to ExecuTorch's C++ runtime (libexecutorch.so from the executorch wheel) for edgekit's executorch
// runner, which loads it with ctypes: a .pte runs with XNNPack and ExecuTorch's optimized kernels, without torch.
// Built on the device (python -m edge.backends.executorch.native build; install-device.sh --runtime executorch)
// against the headers and libraries the executorch wheel ships. float32 tensors in, float32 tensors out.
#include <executorch/extension/module/module.h>
#include <executorch/extension/tensor/tensor.h>
#include <executorch/runtime/backend/interface.h>
#include <executorch/runtime/platform/runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

using executorch::extension::from_blob;
using executorch::extension::TensorPtr;
using executorch::extension::module::Module;
using executorch::runtime::Error;
using executorch::runtime::EValue;

namespace {
struct Handle {
  std::unique_ptr<Module> module;
  std::string method;
};

void say(char* err, size_t n, const char* fmt, const char* what, int code) {
  if (err != nullptr && n > 0) std::snprintf(err, n, fmt, what, code);
}
}  // namespace

extern "C" {

// 1 when the runtime's backend registry holds the named backend (XnnpackBackend), else 0
int ek_et_has_backend(const char* name) {
  executorch::runtime::runtime_init();
  return executorch::runtime::get_backend_class(name) != nullptr ? 1 : 0;
}

// the .pte at path with its method loaded; nullptr and a message in err on failure
void* ek_et_open(const char* path, const char* method, char* err, size_t errlen) {
  auto h = std::make_unique<Handle>();
  h->method = method;
  h->module = std::make_unique<Module>(std::string(path), Module::LoadMode::File);
  Error e = h->module->load_method(h->method);
  if (e != Error::Ok) {
    say(err, errlen, "ExecuTorch could not load method %s (error 0x%x)", method, static_cast<int>(e));
    return nullptr;
  }
  return h.release();
}

int ek_et_num_inputs(void* handle) {
  auto* h = static_cast<Handle*>(handle);
  auto meta = h->module->method_meta(h->method);
  return meta.ok() ? static_cast<int>(meta->num_inputs()) : -1;
}

int ek_et_num_outputs(void* handle) {
  auto* h = static_cast<Handle*>(handle);
  auto meta = h->module->method_meta(h->method);
  return meta.ok() ? static_cast<int>(meta->num_outputs()) : -1;
}

// run once: n_in float32 inputs (data, rank, dims flattened in order); each output copied into outs[i], which holds
// out_numel[i] floats (the output must have exactly that many). 0 on success, else an error code and a message.
int ek_et_run(void* handle, int n_in, float** ins, const int* ranks, const int64_t* dims, int n_out, float** outs,
              const int64_t* out_numel, char* err, size_t errlen) {
  auto* h = static_cast<Handle*>(handle);
  std::vector<TensorPtr> tensors;
  std::vector<EValue> values;
  const int64_t* d = dims;
  for (int i = 0; i < n_in; ++i) {
    std::vector<executorch::aten::SizesType> sizes(d, d + ranks[i]);
    d += ranks[i];
    tensors.push_back(from_blob(ins[i], sizes, executorch::aten::ScalarType::Float));
    values.emplace_back(*tensors.back());
  }
  auto result = h->module->execute(h->method, values);
  if (!result.ok()) {
    say(err, errlen, "ExecuTorch failed to execute %s (error 0x%x)", h->method.c_str(), static_cast<int>(result.error()));
    return 1;
  }
  if (static_cast<int>(result->size()) != n_out) {
    say(err, errlen, "the method %s returned %d outputs", h->method.c_str(), static_cast<int>(result->size()));
    return 2;
  }
  for (int i = 0; i < n_out; ++i) {
    const EValue& v = (*result)[i];
    if (!v.isTensor()) {
      say(err, errlen, "output %s%d is not a tensor", "", i);
      return 3;
    }
    const auto& t = v.toTensor();
    if (t.scalar_type() != executorch::aten::ScalarType::Float || t.numel() != out_numel[i]) {
      say(err, errlen, "output %s%d is not the float32 tensor the bundle's I/O names", "", i);
      return 4;
    }
    std::memcpy(outs[i], t.const_data_ptr<float>(), sizeof(float) * static_cast<size_t>(t.numel()));
  }
  return 0;
}

void ek_et_close(void* handle) { delete static_cast<Handle*>(handle); }

}  // extern "C"
