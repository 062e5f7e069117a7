// hetero_metal._metal: the Metal host code (metal-cpp), macOS only. It compiles the plugin's .metal families into
// libraries, caches a compute pipeline per kernel, and encodes what the Python side planned into one command
// buffer, one compute encoder, committed at once: direct dispatches (hetero_metal.plan: kernel, buffers by index,
// inline constant bytes, threadgroups) and recorded command plans (hetero_metal.command_plan), each encoded once
// into an MTLIndirectCommandBuffer and executed again at every replayed step. Nothing here decides a size or an argument: that is the shared plan, which
// the emulator runs on Linux.
//
// Memory: tensors are host numpy arrays. An array whose address and length are page-aligned is wrapped as a
// shared-storage MTLBuffer without a copy (newBufferWithBytesNoCopy; unified memory); any other array is staged in
// a shared buffer and, when writable, copied back after the command buffer completes.
#define NS_PRIVATE_IMPLEMENTATION
#define MTL_PRIVATE_IMPLEMENTATION
#include <Foundation/Foundation.hpp>
#include <Metal/Metal.hpp>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <tuple>
#include <utility>
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

// A host array a command buffer reads through a shared-storage copy (its address or length is not page-aligned):
// copied in before the command buffer is committed (`copy_in`), back after it completes (`copy_back`: the kernels
// may write it and the host array is writable).
struct Staged {
    MTL::Buffer* buffer;
    void* host;
    std::size_t bytes;
    bool copy_in;
    bool copy_back;
};

// A recorded command plan (hetero_metal.command_plan.CommandPlan) encoded once into an indirect command buffer:
// every command's pipeline, buffers with offsets and grid fixed; executing it again encodes nothing new. Only the
// contents of its buffers change between runs (argument buffers the host rewrote, staged arrays copied in).
struct Plan {
    MTL::IndirectCommandBuffer* commands = nullptr;
    NS::UInteger count = 0;
    std::vector<MTL::Buffer*> buffers;
    std::vector<void*> hosts;  // the host allocation each buffer stands for
    std::vector<Staged> staged;
    py::list arrays;  // the host arrays the buffers wrap stay alive while the plan does
};

constexpr NS::UInteger kMaxBufferBinds = 31;

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
        try {
            wait();
        } catch (const std::exception&) {
        }
        for (auto& entry : plans_) release(entry.second);
        for (auto& entry : read_only_) entry.second.first->release();
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

    bool has_plan(std::uint64_t id) const { return plans_.count(id) != 0; }

    // commands: (family, kernel, [(buffer index, plan buffer, byte offset)], groups, threads) in order; arrays:
    // the plan's buffers; written: the plan buffers some command writes.
    void record(std::uint64_t id, const py::list& commands, const py::list& arrays, const std::vector<std::size_t>& written) {
        if (plans_.count(id) != 0) return;
        NS::AutoreleasePool* pool = NS::AutoreleasePool::alloc()->init();
        Plan plan;
        plan.arrays = arrays;
        for (std::size_t i = 0; i < std::size_t(py::len(arrays)); ++i) {
            const bool writes = std::find(written.begin(), written.end(), i) != written.end();
            py::buffer_info info = arrays[i].cast<py::buffer>().request();
            const std::size_t bytes = std::size_t(info.size * info.itemsize);
            Staged staged{nullptr, info.ptr, bytes, !info.readonly, writes && !info.readonly};
            MTL::Buffer* buffer = info.readonly ? read_only(info.ptr, bytes)->retain() : wrap(info.ptr, bytes, staged);
            if (staged.buffer != nullptr) plan.staged.push_back(staged);
            plan.buffers.push_back(buffer);
            plan.hosts.push_back(info.ptr);
        }
        MTL::IndirectCommandBufferDescriptor* descriptor = MTL::IndirectCommandBufferDescriptor::alloc()->init();
        descriptor->setCommandTypes(MTL::IndirectCommandTypeConcurrentDispatch);
        descriptor->setInheritPipelineState(false);
        descriptor->setInheritBuffers(false);
        descriptor->setMaxKernelBufferBindCount(kMaxBufferBinds);
        plan.count = NS::UInteger(py::len(commands));
        plan.commands = device_->newIndirectCommandBuffer(descriptor, plan.count, MTL::ResourceStorageModeShared);
        descriptor->release();
        if (plan.commands == nullptr) {
            release(plan);
            pool->release();
            throw std::runtime_error("newIndirectCommandBuffer failed for " + std::to_string(plan.count) + " commands");
        }
        NS::UInteger i = 0;
        for (const py::handle& item : commands) {
            auto c = item.cast<py::tuple>();
            MTL::IndirectComputeCommand* command = plan.commands->indirectComputeCommand(i++);
            command->setComputePipelineState(pipeline(c[0].cast<std::string>(), c[1].cast<std::string>()));
            for (const py::handle& binding : c[2].cast<py::list>()) {
                auto b = binding.cast<std::tuple<NS::UInteger, std::size_t, NS::UInteger>>();
                command->setKernelBuffer(plan.buffers.at(std::get<1>(b)), std::get<2>(b), std::get<0>(b));
            }
            auto g = c[3].cast<std::vector<NS::UInteger>>();
            auto t = c[4].cast<std::vector<NS::UInteger>>();
            command->concurrentDispatchThreadgroups(MTL::Size(g[0], g[1], g[2]), MTL::Size(t[0], t[1], t[2]));
            // Commands of an indirect command buffer do not serialize their resource accesses by themselves: each
            // one waits for the previous (the plan is a sequence of dependent kernels).
            command->setBarrier();
        }
        plans_[id] = plan;
        pool->release();
    }

    void forget(std::uint64_t id) {
        auto found = plans_.find(id);
        if (found == plans_.end()) return;
        wait();  // a committed command buffer may still execute it
        release(found->second);
        plans_.erase(found);
    }

    // work: in order, (0, id of a recorded plan) — executed from its indirect command buffer — or (1, i): the
    // direct dispatch commands[i] = (family, kernel, [(buffer index, table buffer, byte offset)], groups, threads)
    // over the table `arrays` (hetero_metal.command_plan.CommandPlan: arrays[0] holds the constant structs);
    // written: the table buffers some direct dispatch writes. One command buffer, one serial compute encoder,
    // committed at once. Within it each host allocation is one MTLBuffer (a plan's, or wrapped here once), so a
    // staged copy is never read by one dispatch while another writes a different copy of the same memory.
    void submit(const py::list& work, const py::list& commands, const py::list& arrays, const std::vector<std::size_t>& written) {
        NS::AutoreleasePool* pool = NS::AutoreleasePool::alloc()->init();
        std::map<const void*, MTL::Buffer*> by_host;
        for (const py::handle& item : work) {
            auto w = item.cast<std::pair<int, std::uint64_t>>();
            if (w.first != 0) continue;
            const Plan& plan = plans_.at(w.second);
            for (std::size_t i = 0; i < plan.buffers.size(); ++i) by_host.emplace(plan.hosts[i], plan.buffers[i]);
        }
        std::vector<MTL::Buffer*> table;
        for (std::size_t i = 0; i < std::size_t(py::len(arrays)); ++i) {
            py::buffer_info info = arrays[i].cast<py::buffer>().request();  // read-only weights too
            auto found = by_host.find(info.ptr);
            if (found != by_host.end()) {
                table.push_back(found->second);
                continue;
            }
            const std::size_t bytes = std::size_t(info.size * info.itemsize);
            if (info.readonly) {  // weights: one buffer for the queue's lifetime
                MTL::Buffer* buffer = read_only(arrays[i], info.ptr, bytes);
                by_host.emplace(info.ptr, buffer);
                table.push_back(buffer);
                continue;
            }
            const bool writes = std::find(written.begin(), written.end(), i) != written.end();
            Staged staged{nullptr, info.ptr, bytes, false, writes};
            MTL::Buffer* buffer = wrap(info.ptr, bytes, staged);  // staged: a copy made just now
            if (staged.buffer != nullptr) staged_.push_back(staged);
            held_.push_back(buffer);
            by_host.emplace(info.ptr, buffer);
            table.push_back(buffer);
        }
        MTL::CommandBuffer* command = queue_->commandBuffer();
        MTL::ComputeCommandEncoder* encoder = command->computeCommandEncoder();
        for (const py::handle& item : work) {
            auto w = item.cast<std::pair<int, std::uint64_t>>();
            if (w.first == 0) {
                execute(encoder, plans_.at(w.second));
                continue;
            }
            auto d = commands[std::size_t(w.second)].cast<py::tuple>();
            encoder->setComputePipelineState(pipeline(d[0].cast<std::string>(), d[1].cast<std::string>()));
            for (const py::handle& binding : d[2].cast<py::list>()) {
                auto b = binding.cast<std::tuple<NS::UInteger, std::size_t, NS::UInteger>>();
                encoder->setBuffer(table.at(std::get<1>(b)), std::get<2>(b), std::get<0>(b));
            }
            auto g = d[3].cast<std::vector<NS::UInteger>>();
            auto t = d[4].cast<std::vector<NS::UInteger>>();
            encoder->dispatchThreadgroups(MTL::Size(g[0], g[1], g[2]), MTL::Size(t[0], t[1], t[2]));
        }
        encoder->endEncoding();
        command->commit();
        pending_.push_back(command->retain());
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
        for (const Staged& s : staged_) {
            if (s.copy_back) std::memcpy(s.host, s.buffer->contents(), s.bytes);
        }
        staged_.clear();
        for (MTL::Buffer* b : held_) b->release();
        held_.clear();
        if (!failure.empty()) throw std::runtime_error("Metal command buffer failed: " + failure);
    }

  private:
    void execute(MTL::ComputeCommandEncoder* encoder, Plan& plan) {
        for (const Staged& s : plan.staged) {
            if (s.copy_in) std::memcpy(s.buffer->contents(), s.host, s.bytes);  // the host may have rewritten it
            if (s.copy_back) staged_.push_back({s.buffer, s.host, s.bytes, false, true});
        }
        // An indirect command buffer's buffers are not tracked by the encoder: declare each resident.
        const auto usage = MTL::ResourceUsage(MTL::ResourceUsageRead | MTL::ResourceUsageWrite);
        for (MTL::Buffer* buffer : plan.buffers) encoder->useResource(buffer, usage);
        encoder->memoryBarrier(MTL::BarrierScopeBuffers);  // after the direct dispatches encoded before it
        encoder->executeCommandsInBuffer(plan.commands, NS::Range::Make(0, plan.count));
        encoder->memoryBarrier(MTL::BarrierScopeBuffers);  // before what follows reads its results
    }

    void release(Plan& plan) {
        if (plan.commands != nullptr) plan.commands->release();
        for (MTL::Buffer* b : plan.buffers) b->release();
        plan.buffers.clear();
        plan.staged.clear();
    }

    MTL::ComputePipelineState* pipeline(const std::string& family, const std::string& kernel) {
        auto found = pipelines_.find(kernel);
        if (found != pipelines_.end()) return found->second;
        auto library = libraries_.find(family);
        if (library == libraries_.end()) throw std::runtime_error("Metal library " + family + " is not compiled");
        MTL::Function* function = library->second->newFunction(NS::String::string(kernel.c_str(), NS::UTF8StringEncoding));
        if (function == nullptr) throw std::runtime_error("no kernel " + kernel + " in " + family + ".metal");
        MTL::ComputePipelineDescriptor* descriptor = MTL::ComputePipelineDescriptor::alloc()->init();
        descriptor->setComputeFunction(function);
        descriptor->setSupportIndirectCommandBuffers(true);  // the same pipeline serves direct and recorded dispatches
        NS::Error* error = nullptr;
        MTL::ComputePipelineState* state = device_->newComputePipelineState(descriptor, MTL::PipelineOptionNone, nullptr, &error);
        descriptor->release();
        function->release();
        if (state == nullptr) throw std::runtime_error("pipeline for " + kernel + ": " + error_text(error));
        pipelines_[kernel] = state;
        return state;
    }

    // A read-only host array (weights): wrapped or copied once and kept for the queue's lifetime, keyed by address and
    // length (numpy cannot write it, so the copy stays right). The array itself is kept alive with its buffer: were
    // it freed, a new array at the same address would find the old copy.
    MTL::Buffer* read_only(const py::handle& owner, void* host, std::size_t bytes) {
        const auto key = std::make_pair(static_cast<const void*>(host), bytes);
        auto found = read_only_.find(key);
        if (found != read_only_.end()) return found->second.first;
        Staged ignored{nullptr, host, bytes, false, false};
        MTL::Buffer* buffer = wrap(host, bytes, ignored);
        read_only_[key] = {buffer, py::reinterpret_borrow<py::object>(owner)};
        return buffer;
    }

    // A shared-storage buffer over `host`: the array itself where page-aligned (no copy, unified memory), else a
    // copy (made now, holding the host's current contents), described in `staged` (staged.buffer set).
    MTL::Buffer* wrap(void* host, std::size_t bytes, Staged& staged) {
        const bool aligned = reinterpret_cast<std::uintptr_t>(host) % page_ == 0 && bytes % page_ == 0 && bytes > 0;
        if (aligned) return device_->newBuffer(host, bytes, MTL::ResourceStorageModeShared, nullptr);
        MTL::Buffer* buffer = device_->newBuffer(host, bytes > 0 ? bytes : 4, MTL::ResourceStorageModeShared);
        staged.buffer = buffer;
        return buffer;
    }

    MTL::Device* device_ = nullptr;
    MTL::CommandQueue* queue_ = nullptr;
    std::size_t page_ = 4096;
    std::map<std::string, MTL::Library*> libraries_;
    std::map<std::string, MTL::ComputePipelineState*> pipelines_;
    std::map<std::uint64_t, Plan> plans_;
    std::map<std::pair<const void*, std::size_t>, std::pair<MTL::Buffer*, py::object>> read_only_;
    std::vector<MTL::CommandBuffer*> pending_;
    std::vector<Staged> staged_;  // copied back once the pending command buffers complete
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
        .def("has_plan", &Queue::has_plan)
        .def("record", &Queue::record, py::arg("id"), py::arg("commands"), py::arg("arrays"), py::arg("written"),
             "encode a command plan once into an indirect command buffer")
        .def("forget", &Queue::forget, "release a recorded plan")
        .def("submit", &Queue::submit, py::arg("work"), py::arg("commands"), py::arg("arrays"), py::arg("written"),
             "encode plans and direct dispatches, in order, into one command buffer; commit it")
        .def("wait", &Queue::wait, "wait for every committed command buffer; copies staged buffers back");
}
