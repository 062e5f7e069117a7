// hetero_opencl._native: the OpenCL host side, kept small. Python decides what to run; this module owns the
// OpenCL objects (context, in-order queue, buffers, programs, kernels), pools device buffers so the decode loop does
// not call clCreateBuffer per op, and turns launch arguments (Buffer / int / float / Local) into clSetKernelArg calls.
// Everything is enqueued on one in-order queue; only `read` (a download) waits.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <vector>

namespace py = pybind11;

#ifndef HETERO_HAVE_OPENCL

PYBIND11_MODULE(_native, m) {
  m.attr("built_with_opencl") = false;
  m.def("platforms", []() -> py::list {
    throw std::runtime_error("hetero-opencl was built without the OpenCL headers and ICD loader");
  });
}

#else

#include <CL/cl.h>

namespace {

class ClError : public std::runtime_error {
 public:
  ClError(const std::string& what, cl_int code)
      : std::runtime_error(what + " failed: " + name(code) + " (" + std::to_string(code) + ")"), code(code) {}
  cl_int code;

  static std::string name(cl_int c) {
    switch (c) {
      case CL_DEVICE_NOT_FOUND: return "CL_DEVICE_NOT_FOUND";
      case CL_DEVICE_NOT_AVAILABLE: return "CL_DEVICE_NOT_AVAILABLE";
      case CL_MEM_OBJECT_ALLOCATION_FAILURE: return "CL_MEM_OBJECT_ALLOCATION_FAILURE";
      case CL_OUT_OF_RESOURCES: return "CL_OUT_OF_RESOURCES";
      case CL_OUT_OF_HOST_MEMORY: return "CL_OUT_OF_HOST_MEMORY";
      case CL_BUILD_PROGRAM_FAILURE: return "CL_BUILD_PROGRAM_FAILURE";
      case CL_INVALID_VALUE: return "CL_INVALID_VALUE";
      case CL_INVALID_BINARY: return "CL_INVALID_BINARY";
      case CL_INVALID_BUILD_OPTIONS: return "CL_INVALID_BUILD_OPTIONS";
      case CL_INVALID_KERNEL_NAME: return "CL_INVALID_KERNEL_NAME";
      case CL_INVALID_KERNEL_ARGS: return "CL_INVALID_KERNEL_ARGS";
      case CL_INVALID_ARG_INDEX: return "CL_INVALID_ARG_INDEX";
      case CL_INVALID_ARG_SIZE: return "CL_INVALID_ARG_SIZE";
      case CL_INVALID_WORK_GROUP_SIZE: return "CL_INVALID_WORK_GROUP_SIZE";
      case CL_INVALID_WORK_ITEM_SIZE: return "CL_INVALID_WORK_ITEM_SIZE";
      case CL_INVALID_GLOBAL_WORK_SIZE: return "CL_INVALID_GLOBAL_WORK_SIZE";
      case CL_INVALID_BUFFER_SIZE: return "CL_INVALID_BUFFER_SIZE";
      case CL_INVALID_MEM_OBJECT: return "CL_INVALID_MEM_OBJECT";
      case -1001: return "CL_PLATFORM_NOT_FOUND_KHR";
      default: return "OpenCL error";
    }
  }
};

void check(cl_int err, const char* what) {
  if (err != CL_SUCCESS) throw ClError(what, err);
}

std::string device_string(cl_device_id d, cl_device_info what) {
  size_t n = 0;
  check(clGetDeviceInfo(d, what, 0, nullptr, &n), "clGetDeviceInfo");
  std::string s(n, '\0');
  check(clGetDeviceInfo(d, what, n, s.data(), nullptr), "clGetDeviceInfo");
  while (!s.empty() && (s.back() == '\0' || s.back() == ' ')) s.pop_back();
  return s;
}

template <typename T>
T device_value(cl_device_id d, cl_device_info what) {
  T v{};
  check(clGetDeviceInfo(d, what, sizeof(T), &v, nullptr), "clGetDeviceInfo");
  return v;
}

std::string platform_string(cl_platform_id p, cl_platform_info what) {
  size_t n = 0;
  check(clGetPlatformInfo(p, what, 0, nullptr, &n), "clGetPlatformInfo");
  std::string s(n, '\0');
  check(clGetPlatformInfo(p, what, n, s.data(), nullptr), "clGetPlatformInfo");
  while (!s.empty() && s.back() == '\0') s.pop_back();
  return s;
}

std::vector<cl_platform_id> platform_ids() {
  cl_uint n = 0;
  cl_int err = clGetPlatformIDs(0, nullptr, &n);
  if (err == -1001 || n == 0) return {};  // CL_PLATFORM_NOT_FOUND_KHR: the loader found no ICD
  check(err, "clGetPlatformIDs");
  std::vector<cl_platform_id> ids(n);
  check(clGetPlatformIDs(n, ids.data(), nullptr), "clGetPlatformIDs");
  return ids;
}

std::vector<cl_device_id> device_ids(cl_platform_id p) {
  cl_uint n = 0;
  cl_int err = clGetDeviceIDs(p, CL_DEVICE_TYPE_ALL, 0, nullptr, &n);
  if (err == CL_DEVICE_NOT_FOUND || n == 0) return {};
  check(err, "clGetDeviceIDs");
  std::vector<cl_device_id> ids(n);
  check(clGetDeviceIDs(p, CL_DEVICE_TYPE_ALL, n, ids.data(), nullptr), "clGetDeviceIDs");
  return ids;
}

py::dict describe(cl_device_id d) {
  py::dict info;
  const std::string ext = device_string(d, CL_DEVICE_EXTENSIONS);
  const auto type = device_value<cl_device_type>(d, CL_DEVICE_TYPE);
  info["name"] = device_string(d, CL_DEVICE_NAME);
  info["vendor"] = device_string(d, CL_DEVICE_VENDOR);
  info["version"] = device_string(d, CL_DEVICE_VERSION);
  info["driver_version"] = device_string(d, CL_DRIVER_VERSION);
  info["opencl_c_version"] = device_string(d, CL_DEVICE_OPENCL_C_VERSION);
  info["type"] = (type & CL_DEVICE_TYPE_GPU) ? "gpu" : (type & CL_DEVICE_TYPE_ACCELERATOR) ? "npu" : "cpu";
  info["global_mem_bytes"] = device_value<cl_ulong>(d, CL_DEVICE_GLOBAL_MEM_SIZE);
  info["local_mem_bytes"] = device_value<cl_ulong>(d, CL_DEVICE_LOCAL_MEM_SIZE);
  info["max_alloc_bytes"] = device_value<cl_ulong>(d, CL_DEVICE_MAX_MEM_ALLOC_SIZE);
  info["compute_units"] = device_value<cl_uint>(d, CL_DEVICE_MAX_COMPUTE_UNITS);
  info["max_work_group_size"] = device_value<size_t>(d, CL_DEVICE_MAX_WORK_GROUP_SIZE);
  // Sub-buffer origins (a session's arena slices) must be multiples of this many bytes.
  info["base_align_bytes"] = device_value<cl_uint>(d, CL_DEVICE_MEM_BASE_ADDR_ALIGN) / 8;
  info["extensions"] = ext;
  info["available"] = device_value<cl_bool>(d, CL_DEVICE_AVAILABLE) != 0;
  return info;
}

py::list platforms() {
  py::list out;
  for (cl_platform_id p : platform_ids()) {
    py::dict pd;
    pd["name"] = platform_string(p, CL_PLATFORM_NAME);
    pd["vendor"] = platform_string(p, CL_PLATFORM_VENDOR);
    pd["version"] = platform_string(p, CL_PLATFORM_VERSION);
    py::list devs;
    for (cl_device_id d : device_ids(p)) devs.append(describe(d));
    pd["devices"] = devs;
    out.append(pd);
  }
  return out;
}

// The cl_context and its command queue, released only after the last object made in the context. Python's garbage
// collector frees a session's cycle in any order (the Context object before its Buffers), and so does the
// interpreter's exit; the specification has a memory object or a program keep its context alive, but with every
// object holding this handle no release depends on a driver doing that right. The Context object's close() drops
// only its own reference (after which the object refuses work).
struct ContextHandle {
  cl_context ctx = nullptr;
  cl_command_queue queue = nullptr;
  ContextHandle() = default;
  ContextHandle(const ContextHandle&) = delete;
  ContextHandle& operator=(const ContextHandle&) = delete;
  ~ContextHandle() {
    if (queue) clReleaseCommandQueue(queue);
    if (ctx) clReleaseContext(ctx);
  }
};

// Released cl_mem objects wait here, by capacity, for the next allocation of the same size: decode steps allocate
// the same sizes every token.
struct Pool {
  std::shared_ptr<ContextHandle> owner;  // released after the pooled and the live buffers (Buffer holds the pool)
  std::unordered_map<size_t, std::vector<cl_mem>> free;
  size_t pooled = 0;
  size_t limit = size_t(1) << 30;
  bool closed = false;

  void give(cl_mem m, size_t cap) {
    if (closed || pooled + cap > limit) {
      clReleaseMemObject(m);
      return;
    }
    free[cap].push_back(m);
    pooled += cap;
  }
  cl_mem take(size_t cap) {
    auto it = free.find(cap);
    if (it == free.end() || it->second.empty()) return nullptr;
    cl_mem m = it->second.back();
    it->second.pop_back();
    pooled -= cap;
    return m;
  }
  void drain() {
    for (auto& kv : free)
      for (cl_mem m : kv.second) clReleaseMemObject(m);
    free.clear();
    pooled = 0;
  }
  ~Pool() { drain(); }
};

size_t capacity_for(size_t nbytes) {
  if (nbytes == 0) nbytes = 1;
  if (nbytes <= 4096) return (nbytes + 63) & ~size_t(63);
  if (nbytes <= (size_t(1) << 20)) return (nbytes + 4095) & ~size_t(4095);
  return (nbytes + 65535) & ~size_t(65535);
}

struct Buffer {
  cl_mem mem = nullptr;
  size_t nbytes = 0;
  size_t cap = 0;
  std::shared_ptr<Pool> pool;
  // A sub-buffer (a slice of an arena) keeps its parent alive and is released, not pooled.
  std::shared_ptr<Buffer> parent;

  Buffer() = default;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  ~Buffer() {
    if (mem == nullptr) return;
    if (pool) {
      pool->give(mem, cap);
    } else {
      clReleaseMemObject(mem);
    }
  }
};

// Every host-side transfer stays inside the buffer's requested size (not only its pooled capacity): a size mismatch
// between a tensor and its buffer is an error here, never a write past the block (offset + n checked without
// overflow).
void check_range(const Buffer& b, size_t offset, size_t n, const char* what) {
  if (offset > b.nbytes || n > b.nbytes - offset)
    throw std::out_of_range(std::string(what) + " of " + std::to_string(n) + " bytes at offset " +
                            std::to_string(offset) + " outside a buffer of " + std::to_string(b.nbytes) + " bytes");
}

struct Local {
  size_t nbytes;
};

struct Kernel {
  cl_kernel k = nullptr;
  std::string name;
  cl_program program = nullptr;  // retained: the kernel keeps its program alive
  std::shared_ptr<ContextHandle> owner;  // and the program its context (destroyed after the releases below)
  ~Kernel() {
    if (k) clReleaseKernel(k);
    if (program) clReleaseProgram(program);
  }
};

struct Program {
  cl_program p = nullptr;
  cl_device_id device = nullptr;
  std::shared_ptr<ContextHandle> owner;
  ~Program() {
    if (p) clReleaseProgram(p);
  }

  py::bytes binary() const {
    size_t size = 0;
    check(clGetProgramInfo(p, CL_PROGRAM_BINARY_SIZES, sizeof(size), &size, nullptr), "clGetProgramInfo");
    std::string data(size, '\0');
    unsigned char* ptr = reinterpret_cast<unsigned char*>(data.data());
    check(clGetProgramInfo(p, CL_PROGRAM_BINARIES, sizeof(ptr), &ptr, nullptr), "clGetProgramInfo");
    return py::bytes(data);
  }

  std::shared_ptr<Kernel> kernel(const std::string& name) const {
    cl_int err = CL_SUCCESS;
    auto k = std::make_shared<Kernel>();
    k->k = clCreateKernel(p, name.c_str(), &err);
    check(err, ("clCreateKernel(" + name + ")").c_str());
    k->name = name;
    clRetainProgram(p);
    k->program = p;
    k->owner = owner;
    return k;
  }

  std::vector<std::string> kernel_names() const {
    size_t n = 0;
    check(clGetProgramInfo(p, CL_PROGRAM_KERNEL_NAMES, 0, nullptr, &n), "clGetProgramInfo");
    std::string s(n, '\0');
    check(clGetProgramInfo(p, CL_PROGRAM_KERNEL_NAMES, n, s.data(), nullptr), "clGetProgramInfo");
    std::vector<std::string> names;
    std::string cur;
    for (char c : s) {
      if (c == ';' || c == '\0') {
        if (!cur.empty()) names.push_back(cur);
        cur.clear();
      } else {
        cur += c;
      }
    }
    if (!cur.empty()) names.push_back(cur);
    return names;
  }
};

std::string build_log(cl_program p, cl_device_id d) {
  size_t n = 0;
  clGetProgramBuildInfo(p, d, CL_PROGRAM_BUILD_LOG, 0, nullptr, &n);
  std::string log(n, '\0');
  clGetProgramBuildInfo(p, d, CL_PROGRAM_BUILD_LOG, n, log.data(), nullptr);
  while (!log.empty() && log.back() == '\0') log.pop_back();
  return log;
}

class Context {
 public:
  Context(int platform, int device) {
    auto plats = platform_ids();
    if (platform < 0 || platform >= static_cast<int>(plats.size()))
      throw std::invalid_argument("no OpenCL platform #" + std::to_string(platform));
    auto devs = device_ids(plats[platform]);
    if (device < 0 || device >= static_cast<int>(devs.size()))
      throw std::invalid_argument("no OpenCL device #" + std::to_string(device) + " on platform #" +
                                  std::to_string(platform));
    dev_ = devs[device];
    cl_int err = CL_SUCCESS;
    owner_ = std::make_shared<ContextHandle>();
    owner_->ctx = ctx_ = clCreateContext(nullptr, 1, &dev_, nullptr, nullptr, &err);
    check(err, "clCreateContext");
    owner_->queue = queue_ = clCreateCommandQueue(ctx_, dev_, 0, &err);
    check(err, "clCreateCommandQueue");
    pool_ = std::make_shared<Pool>();
    pool_->owner = owner_;
  }
  ~Context() { close(); }

  void close() {
    if (queue_) {
      clFinish(queue_);
      pending_.clear();
      queue_ = nullptr;
    }
    if (pool_) {
      pool_->drain();
      pool_->closed = true;
    }
    ctx_ = nullptr;
    owner_.reset();  // the queue and the context go with the last buffer, program or kernel made in them
  }

  py::dict info() const { return describe(dev_); }

  std::shared_ptr<Buffer> alloc(size_t nbytes) {
    live();
    auto b = std::make_shared<Buffer>();
    b->nbytes = nbytes;
    b->cap = capacity_for(nbytes);
    b->mem = pool_->take(b->cap);
    if (b->mem == nullptr) {
      cl_int err = CL_SUCCESS;
      b->mem = clCreateBuffer(ctx_, CL_MEM_READ_WRITE, b->cap, nullptr, &err);
      if (err == CL_MEM_OBJECT_ALLOCATION_FAILURE || err == CL_OUT_OF_RESOURCES) {
        pool_->drain();  // cached buffers may be what stands in the way
        b->mem = clCreateBuffer(ctx_, CL_MEM_READ_WRITE, b->cap, nullptr, &err);
      }
      check(err, ("clCreateBuffer(" + std::to_string(b->cap) + " bytes)").c_str());
    }
    b->pool = pool_;
    return b;
  }

  // A slice of `parent` sharing its memory (clCreateSubBuffer): the session's arena hands these out as tensors.
  std::shared_ptr<Buffer> sub(const std::shared_ptr<Buffer>& parent, size_t offset, size_t nbytes) {
    live();
    if (offset + nbytes > parent->cap) throw std::invalid_argument("sub-buffer past the end of its parent");
    auto b = std::make_shared<Buffer>();
    cl_buffer_region region{offset, nbytes == 0 ? 1 : nbytes};
    cl_int err = CL_SUCCESS;
    b->mem = clCreateSubBuffer(parent->mem, CL_MEM_READ_WRITE, CL_BUFFER_CREATE_TYPE_REGION, &region, &err);
    check(err, ("clCreateSubBuffer(" + std::to_string(offset) + ", " + std::to_string(nbytes) + ")").c_str());
    b->nbytes = nbytes;
    b->cap = region.size;
    b->parent = parent;
    return b;
  }

  // blocking=false queues the write and keeps `src` alive until the queue next drains (read / finish): the
  // decode loop uploads its token and position without waiting for the device.
  void write(Buffer& dst, py::buffer src, size_t offset, bool blocking) {
    live();
    py::buffer_info bi = src.request();
    const size_t n = static_cast<size_t>(bi.size) * static_cast<size_t>(bi.itemsize);
    check_range(dst, offset, n, "write");
    if (n == 0) return;
    if (!blocking && pending_.size() >= 4096) finish();
    check(clEnqueueWriteBuffer(queue_, dst.mem, blocking ? CL_TRUE : CL_FALSE, offset, n, bi.ptr, 0, nullptr,
                               nullptr),
          "clEnqueueWriteBuffer");
    if (!blocking) pending_.push_back(src);
  }

  void read(Buffer& src, py::buffer dst, size_t offset) {
    live();
    py::buffer_info bi = dst.request(true);
    const size_t n = static_cast<size_t>(bi.size) * static_cast<size_t>(bi.itemsize);
    check_range(src, offset, n, "read");
    if (n == 0) return;
    cl_int err;
    {
      py::gil_scoped_release release;
      err = clEnqueueReadBuffer(queue_, src.mem, CL_TRUE, offset, n, bi.ptr, 0, nullptr, nullptr);
    }
    check(err, "clEnqueueReadBuffer");
    pending_.clear();  // in-order queue: every earlier write has completed
  }

  void copy(Buffer& src, Buffer& dst, size_t src_off, size_t dst_off, size_t n) {
    live();
    if (n == 0) return;
    check_range(src, src_off, n, "copy from");
    check_range(dst, dst_off, n, "copy to");
    check(clEnqueueCopyBuffer(queue_, src.mem, dst.mem, src_off, dst_off, n, 0, nullptr, nullptr),
          "clEnqueueCopyBuffer");
  }

  void zero(Buffer& dst, size_t offset, size_t n) {
    live();
    check_range(dst, offset, n, "zero");
    if (n == 0) return;
    const cl_uchar pattern = 0;
    check(clEnqueueFillBuffer(queue_, dst.mem, &pattern, 1, offset, n, 0, nullptr, nullptr), "clEnqueueFillBuffer");
  }

  std::shared_ptr<Program> build(const std::string& source, const std::string& options) {
    live();
    const char* src = source.c_str();
    const size_t len = source.size();
    cl_int err = CL_SUCCESS;
    auto prog = std::make_shared<Program>();
    prog->p = clCreateProgramWithSource(ctx_, 1, &src, &len, &err);
    check(err, "clCreateProgramWithSource");
    prog->device = dev_;
    prog->owner = owner_;
    finish_build(*prog, options);
    return prog;
  }

  std::shared_ptr<Program> load(py::bytes binary, const std::string& options) {
    live();
    std::string data = binary;
    const unsigned char* ptr = reinterpret_cast<const unsigned char*>(data.data());
    const size_t len = data.size();
    cl_int status = CL_SUCCESS, err = CL_SUCCESS;
    auto prog = std::make_shared<Program>();
    prog->p = clCreateProgramWithBinary(ctx_, 1, &dev_, &len, &ptr, &status, &err);
    check(err, "clCreateProgramWithBinary");
    check(status, "clCreateProgramWithBinary (binary status)");
    prog->device = dev_;
    prog->owner = owner_;
    finish_build(*prog, options);
    return prog;
  }

  // launch(kernel, global, local, *args): args are Buffer, int (cl_int), float (cl_float), Local(nbytes) or a
  // one-element int64 numpy array (its current value, as cl_int).
  void launch(Kernel& k, const std::vector<size_t>& global, const std::vector<size_t>& local, py::args args) {
    live();
    cl_uint i = 0;
    for (py::handle a : args) {
      cl_int err;
      if (py::isinstance<Buffer>(a)) {
        Buffer& b = a.cast<Buffer&>();
        err = clSetKernelArg(k.k, i, sizeof(cl_mem), &b.mem);
      } else if (py::isinstance<py::float_>(a)) {
        const cl_float v = a.cast<float>();
        err = clSetKernelArg(k.k, i, sizeof(v), &v);
      } else if (py::isinstance<py::int_>(a)) {
        const cl_int v = a.cast<cl_int>();
        err = clSetKernelArg(k.k, i, sizeof(v), &v);
      } else if (py::isinstance<Local>(a)) {
        err = clSetKernelArg(k.k, i, a.cast<Local&>().nbytes, nullptr);
      } else if (py::isinstance<py::array_t<int64_t>>(a) && a.cast<py::array>().size() == 1) {
        // a one-element int64 host array: its value now, as a cl_int (a bound launch reads past_len each call)
        const cl_int v = static_cast<cl_int>(*static_cast<const int64_t*>(a.cast<py::array>().data()));
        err = clSetKernelArg(k.k, i, sizeof(v), &v);
      } else {
        throw std::invalid_argument(k.name + ": argument " + std::to_string(i) + " has an unsupported type " +
                                    std::string(py::str(py::type::of(a))));
      }
      if (err != CL_SUCCESS) throw ClError(k.name + ": clSetKernelArg(" + std::to_string(i) + ")", err);
      ++i;
    }
    const cl_uint dims = static_cast<cl_uint>(global.size());
    if (dims < 1 || dims > 3 || (!local.empty() && local.size() != global.size()))
      throw std::invalid_argument(k.name + ": global/local sizes must have 1 to 3 matching dims");
    for (size_t g : global)
      if (g == 0) return;  // nothing to do
    const cl_int err = clEnqueueNDRangeKernel(queue_, k.k, dims, nullptr, global.data(),
                                              local.empty() ? nullptr : local.data(), 0, nullptr, nullptr);
    if (err != CL_SUCCESS) throw ClError(k.name + ": clEnqueueNDRangeKernel", err);
  }

  size_t kernel_work_group_size(Kernel& k) {
    size_t v = 0;
    check(clGetKernelWorkGroupInfo(k.k, dev_, CL_KERNEL_WORK_GROUP_SIZE, sizeof(v), &v, nullptr),
          "clGetKernelWorkGroupInfo");
    return v;
  }

  void finish() {
    live();
    cl_int err;
    {
      py::gil_scoped_release release;
      err = clFinish(queue_);
    }
    check(err, "clFinish");
    pending_.clear();
  }
  void flush() {
    live();
    check(clFlush(queue_), "clFlush");
  }
  size_t pooled_bytes() const { return pool_ ? pool_->pooled : 0; }
  void set_pool_limit(size_t n) { pool_->limit = n; }

 private:
  void live() const {
    if (!ctx_) throw std::runtime_error("the OpenCL context was closed");
  }

  void finish_build(Program& prog, const std::string& options) {
    cl_int err;
    {
      py::gil_scoped_release release;  // PoCL takes seconds on a first build
      err = clBuildProgram(prog.p, 1, &dev_, options.c_str(), nullptr, nullptr);
    }
    if (err != CL_SUCCESS) {
      const std::string log = build_log(prog.p, dev_);
      throw ClError("clBuildProgram\n" + log.substr(0, 8000) + "\n", err);
    }
  }

  cl_device_id dev_ = nullptr;
  std::shared_ptr<ContextHandle> owner_;
  cl_context ctx_ = nullptr;  // owner_->ctx and owner_->queue while open
  cl_command_queue queue_ = nullptr;
  std::shared_ptr<Pool> pool_;
  std::vector<py::object> pending_;  // host sources of queued non-blocking writes
};

}  // namespace

PYBIND11_MODULE(_native, m) {
  m.doc() = "OpenCL host code of hetero-opencl: devices, buffers, programs, kernel launches";
  m.attr("built_with_opencl") = true;
  m.def("platforms", &platforms, "every platform the ICD loader finds, with its devices");

  py::register_exception<ClError>(m, "ClError", PyExc_RuntimeError);

  py::class_<Buffer, std::shared_ptr<Buffer>>(m, "Buffer")
      .def_readonly("nbytes", &Buffer::nbytes)
      .def_readonly("capacity", &Buffer::cap)
      .def("__repr__", [](const Buffer& b) { return "<cl_mem " + std::to_string(b.nbytes) + " bytes>"; });

  py::class_<Local>(m, "Local").def(py::init<size_t>()).def_readonly("nbytes", &Local::nbytes);

  py::class_<Kernel, std::shared_ptr<Kernel>>(m, "Kernel").def_readonly("name", &Kernel::name);

  py::class_<Program, std::shared_ptr<Program>>(m, "Program")
      .def("binary", &Program::binary)
      .def("kernel", &Program::kernel)
      .def("kernel_names", &Program::kernel_names);

  py::class_<Context>(m, "Context")
      .def(py::init<int, int>(), py::arg("platform"), py::arg("device"))
      .def("info", &Context::info)
      .def("alloc", &Context::alloc)
      .def("sub", &Context::sub, py::arg("parent"), py::arg("offset"), py::arg("nbytes"))
      .def("write", &Context::write, py::arg("dst"), py::arg("src"), py::arg("offset") = 0,
           py::arg("blocking") = true)
      .def("read", &Context::read, py::arg("src"), py::arg("dst"), py::arg("offset") = 0)
      .def("copy", &Context::copy)
      .def("zero", &Context::zero)
      .def("build", &Context::build)
      .def("load", &Context::load)
      .def("launch", &Context::launch)
      .def("kernel_work_group_size", &Context::kernel_work_group_size)
      .def("finish", &Context::finish)
      .def("flush", &Context::flush)
      .def("pooled_bytes", &Context::pooled_bytes)
      .def("set_pool_limit", &Context::set_pool_limit)
      .def("close", &Context::close);
}

#endif
