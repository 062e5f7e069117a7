// Calls prepared once and run many times without the GIL: the py_* entry points of _native prepare an op and run it
// at once; an LlmStep (llm.cpp, hetero_cpu.fuse.step_calls) keeps a list of them and runs a replay's consecutive
// bound calls as one native call.
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace hetero {

// A call prepared under the GIL (its arguments checked, its pointers taken) and run without it. The arrays and
// weights the pointers point into must outlive the op (the caller's arguments; an LlmStep keeps them).
using Op = std::function<void()>;

// An entry point's call: prepares the op (under the GIL) and runs it without the GIL.
template <class Prep, class... A>
void run_now(Prep prep, A&&... a) {
  Op op = prep(std::forward<A>(a)...);
  pybind11::gil_scoped_release nogil;
  op();
}

// Prepares `args` (a replay's bound call's positional arguments) for a call of a native function, to run again
// and again on the values its arrays hold then. Throws std::invalid_argument (ValueError) where the function's own
// call would refuse them, or would copy an operand (a strided view) once at the call, a copy a prepared op
// could not refresh.
using StepPreparer = Op (*)(const pybind11::tuple& args);

// The native functions (by their name in _native) a step can take, each with its preparer; filled as the module
// is built (module.cpp, onnx_extra.cpp).
void register_step_op(const char* name, StepPreparer prep);
Op prepare_step_op(const std::string& name, const pybind11::tuple& args);
std::vector<std::string> step_op_names();
// A preparer's tuple holds lo to hi arguments (an entry point's trailing defaults may be left out), else
// std::invalid_argument naming fn.
void step_arity(const pybind11::tuple& args, std::size_t lo, std::size_t hi, const char* fn);
// Argument i of a preparer's tuple, which must be a numpy array already (an entry point's caster would convert a
// list into a temporary the op would outlive).
pybind11::array step_array(const pybind11::tuple& args, std::size_t i, const char* fn);

}  // namespace hetero
