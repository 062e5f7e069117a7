// hetero_metal._metal: the Metal host code (metal-cpp), macOS only. It compiles the plugin's .metal families into
// libraries, caches a compute pipeline per kernel, and encodes the dispatches the Python side planned
// (hetero_metal.plan: kernel, buffers by index, inline constant bytes, threadgroups) into one command buffer, one
// compute encoder, committed at once. Nothing here decides a size or an argument: that is the shared plan, which
// the emulator runs on Linux.
//
// Memory: tensors are host numpy arrays. An array whose address and length are page-aligned is wrapped as a
// shared-storage MTLBuffer without a copy (newBufferWithBytesNoCopy; unified memory); any other array is staged in
// a shared buffer and copied back after the command buffer completes.
#define NS_PRIVATE_IMPLEMENTATION
#define MTL_PRIVATE_IMPLEMENTATION
#include <Foundation/Foundation.hpp>
#include <Metal/Metal.hpp>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <unistd.h>

#include <cstring>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

namespace py = pybind11;

namespace {

std::string text(NS::String* s) { return s != nullptr ? s->utf8String() : std::string(); }

std::string error_text(NS::Error* error) {
    return error != nullptr ? text(error->localizedDescription()) : std::string("unknown error");
}

py::list devices() {
    NS::AutoreleasePool* pool = NS::AutoreleasePool::alloc()->init();
    py::list out;
    NS::Array* all = MTL::CopyAllDevices();
    for (NS::UInteger i = 0; all != nullptr && i < all->count(); ++i) {
        auto* device = static_cast<MTL::Device*>(all->object(i));
        py::dict info;
        info["name"] = text(device->name());
        info["recommended_working_set"] = device->recommendedMaxWorkingSetSize();
        info["unified_memory"] = device->hasUnifiedMemory();
        out.append(info);
    }
    if (all != nullptr) all->release();
    pool->release();
    return out;
}

struct Staged {
    MTL::Buffer* buffer;
    void* host;
    std::size_t bytes;
};

class Queue {
  public:
    explicit Queue(int index) {
        NS::Array* all = MTL::CopyAllDevices();
        if (all == nullptr || NS::UInteger(index) >= all->count()) throw std::runtime_error("no Metal device " + std::to_string(index));
        device_ = static_cast<MTL::Device*>(all->object(NS::UInteger(index)))->retain();
        all->release();
        queue_ = device_->newCommandQueue();
        page_ = std::size_t(getpagesize());
    }
    ~Queue() {
        wait();
        for (auto& entry : pipelines_) entry.second->release();
        for (auto& entry : libraries_) entry.second->release();
        queue_->release();
        device_->release();
    }

    bool has_library(const std::string& family) const { return libraries_.count(family) != 0; }

    void compile(const std::string& family, const std::string& source) {
        NS::AutoreleasePool* pool = NS::AutoreleasePool::alloc()->init();
        MTL::CompileOptions* options = MTL::CompileOptions::alloc()->init();
        options->setFastMathEnabled(false);  // the kernels are checked against float32 references
        NS::Error* error = nullptr;
        MTL::Library* library = device_->newLibrary(NS::String::string(source.c_str(), NS::UTF8StringEncoding), options, &error);
        options->release();
        if (library == nullptr) {
            std::string message = error_text(error);
            pool->release();
            throw std::runtime_error("Metal compile of " + family + ".metal failed: " + message);
        }
        libraries_[family] = library;
        pool->release();
    }

    // dispatches: (family, kernel, {index: array or bytes}, groups (x, y, z), threads (x, y, z)) in order.
    void commit(const py::list& dispatches) {
        NS::AutoreleasePool* pool = NS::AutoreleasePool::alloc()->init();
        MTL::CommandBuffer* command = queue_->commandBuffer();
        MTL::ComputeCommandEncoder* encoder = command->computeCommandEncoder();
        std::vector<MTL::Buffer*> wrapped;
        for (const py::handle& item : dispatches) {
            auto d = item.cast<py::tuple>();
            encoder->setComputePipelineState(pipeline(d[0].cast<std::string>(), d[1].cast<std::string>()));
            for (const auto& arg : d[2].cast<py::dict>()) {
                const auto index = arg.first.cast<NS::UInteger>();
                if (py::isinstance<py::bytes>(arg.second)) {
                    const std::string bytes = arg.second.cast<std::string>();
                    encoder->setBytes(bytes.data(), bytes.size(), index);  // constant structs: inline data
                    continue;
                }
                py::buffer_info info = arg.second.cast<py::buffer>().request();  // read-only weights too
                MTL::Buffer* buffer = wrap(info.ptr, std::size_t(info.size * info.itemsize));
                wrapped.push_back(buffer);
                encoder->setBuffer(buffer, 0, index);
            }
            auto g = d[3].cast<std::vector<NS::UInteger>>();
            auto t = d[4].cast<std::vector<NS::UInteger>>();
            encoder->dispatchThreadgroups(MTL::Size(g[0], g[1], g[2]), MTL::Size(t[0], t[1], t[2]));
        }
        encoder->endEncoding();
        command->commit();
        pending_.push_back(command->retain());
        for (MTL::Buffer* b : wrapped) held_.push_back(b);
        pool->release();
    }

    void wait() {
        std::string failure;
        for (MTL::CommandBuffer* command : pending_) {
            command->waitUntilCompleted();
            if (command->status() == MTL::CommandBufferStatusError && failure.empty()) failure = error_text(command->error());
            command->release();
        }
        pending_.clear();
        for (const Staged& s : staged_) std::memcpy(s.host, s.buffer->contents(), s.bytes);
        staged_.clear();
        for (MTL::Buffer* b : held_) b->release();
        held_.clear();
        if (!failure.empty()) throw std::runtime_error("Metal command buffer failed: " + failure);
    }

  private:
    MTL::ComputePipelineState* pipeline(const std::string& family, const std::string& kernel) {
        auto found = pipelines_.find(kernel);
        if (found != pipelines_.end()) return found->second;
        auto library = libraries_.find(family);
        if (library == libraries_.end()) throw std::runtime_error("Metal library " + family + " is not compiled");
        MTL::Function* function = library->second->newFunction(NS::String::string(kernel.c_str(), NS::UTF8StringEncoding));
        if (function == nullptr) throw std::runtime_error("no kernel " + kernel + " in " + family + ".metal");
        NS::Error* error = nullptr;
        MTL::ComputePipelineState* state = device_->newComputePipelineState(function, &error);
        function->release();
        if (state == nullptr) throw std::runtime_error("pipeline for " + kernel + ": " + error_text(error));
        pipelines_[kernel] = state;
        return state;
    }

    MTL::Buffer* wrap(void* host, std::size_t bytes) {
        const bool aligned = reinterpret_cast<std::uintptr_t>(host) % page_ == 0 && bytes % page_ == 0 && bytes > 0;
        if (aligned) return device_->newBuffer(host, bytes, MTL::ResourceStorageModeShared, nullptr);
        MTL::Buffer* buffer = device_->newBuffer(host, bytes > 0 ? bytes : 4, MTL::ResourceStorageModeShared);  // a copy
        staged_.push_back({buffer, host, bytes});  // copied back in wait(), before held_ releases it
        return buffer;
    }

    MTL::Device* device_ = nullptr;
    MTL::CommandQueue* queue_ = nullptr;
    std::size_t page_ = 4096;
    std::map<std::string, MTL::Library*> libraries_;
    std::map<std::string, MTL::ComputePipelineState*> pipelines_;
    std::vector<MTL::CommandBuffer*> pending_;
    std::vector<Staged> staged_;
    std::vector<MTL::Buffer*> held_;
};

}  // namespace

PYBIND11_MODULE(_metal, m) {
    m.doc() = "Metal host code of hetero-metal (metal-cpp): libraries, cached pipelines, command buffers";
    m.def("devices", &devices, "every Metal device: name, recommended working set, unified memory");
    py::class_<Queue>(m, "Queue")
        .def(py::init<int>(), py::arg("device_index") = 0)
        .def("has_library", &Queue::has_library)
        .def("compile", &Queue::compile, py::arg("family"), py::arg("source"))
        .def("commit", &Queue::commit, "encode the dispatches into one command buffer and commit it")
        .def("wait", &Queue::wait, "wait for every committed command buffer; copies staged buffers back");
}
