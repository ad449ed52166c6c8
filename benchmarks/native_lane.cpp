// A prototype for benchmarks/native_lane.py, not part of xccl: a c10d Backend written in C++ that sits in front of
// the vendor's backend, as a "native lane" for the calls xccl's plan allows natively would.
//
// A one-tensor all_reduce of an allowed dtype with SUM goes straight to the vendor's backend, without Python; with
// `record` on, it is first noted in a ring of plain structs, with the user's frame (code object and last
// instruction) found by a walk that asks Python once per code object whether it is torch's or xccl's. Anything else
// calls `slow`, a Python callable (xccl's own path), under the GIL.
//
// What it leaves out, and a real lane would need: the other collectives, async handles that translate faults into
// xccl's typed errors (a Work wrapper calling Python on error only), the detector (Python, opt-in), and reading the
// ring from xccl's dump.
#include <torch/extension.h>

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <frameobject.h>

#include <array>
#include <chrono>
#include <unordered_map>
#include <vector>

namespace py = pybind11;

namespace {

struct Record {
  int64_t seq = 0;
  int dtype = 0;
  int64_t numel = 0;
  int64_t created_ns = 0;
  PyObject* code = nullptr;  // owned
  int lasti = -1;
};

class Lane : public c10d::Backend {
 public:
  Lane(int rank, int size, c10::intrusive_ptr<c10d::Backend> native, py::object slow, py::object internal)
      : Backend(rank, size),
        native_(std::move(native)),
        slow_(std::move(slow)),
        internal_(std::move(internal)),
        ring_(2000) {}

  ~Lane() override {
    // The members below are Python objects: released while holding the GIL, before the members go.
    py::gil_scoped_acquire gil;
    for (auto& r : ring_) Py_XDECREF(r.code);
    for (auto& k : known_) Py_DECREF(k.first);
    slow_ = py::object();
    internal_ = py::object();
  }

  const std::string getBackendName() const override { return "xccl_lane_prototype"; }

  void allow(int dtype, bool on) { allowed_.at(dtype) = on; }

  bool allowed(c10::ScalarType dtype) const {
    auto i = static_cast<size_t>(dtype);
    return i < allowed_.size() && allowed_[i];
  }

  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts) override {
    if (tensors.size() == 1 && opts.reduceOp == c10d::ReduceOp::SUM && allowed(tensors[0].scalar_type())) {
      if (record) note(tensors[0]);
      return native_->allreduce(tensors, opts);
    }
    py::gil_scoped_acquire gil;
    py::object work = slow_(tensors, opts);
    return work.cast<c10::intrusive_ptr<c10d::Work>>();
  }

  // The newest record: (seq, dtype, numel, created_ns, code, lasti).
  py::tuple last() {
    py::gil_scoped_acquire gil;
    const Record& r = ring_[(seq_ + ring_.size() - 1) % ring_.size()];
    py::object code = r.code ? py::reinterpret_borrow<py::object>(r.code) : py::none();
    return py::make_tuple(r.seq, r.dtype, r.numel, r.created_ns, code, r.lasti);
  }

  bool record = false;

 private:
  void note(const at::Tensor& t) {
    Record& r = ring_[seq_ % ring_.size()];
    r.seq = ++seq_;
    r.dtype = static_cast<int>(t.scalar_type());
    r.numel = t.numel();
    r.created_ns = std::chrono::system_clock::now().time_since_epoch().count();
    // The caller from Python released the GIL for the collective (torch's binding does): take it back for the walk.
    py::gil_scoped_acquire gil;
    PyFrameObject* frame = PyEval_GetFrame();  // borrowed
    Py_XINCREF(frame);
    PyObject* code = nullptr;
    int lasti = -1;
    while (frame != nullptr) {
      PyObject* c = reinterpret_cast<PyObject*>(PyFrame_GetCode(frame));  // new reference
      auto it = known_.find(c);
      bool inside;
      if (it == known_.end()) {
        inside = internal_(py::handle(reinterpret_cast<PyObject*>(frame))).cast<bool>();
        Py_INCREF(c);  // kept as the cache's key
        known_.emplace(c, inside);
      } else {
        inside = it->second;
      }
      if (!inside) {
        code = c;
        lasti = PyFrame_GetLasti(frame);
        Py_DECREF(frame);
        break;
      }
      Py_DECREF(c);
      PyFrameObject* back = PyFrame_GetBack(frame);  // new reference
      Py_DECREF(frame);
      frame = back;
    }
    Py_XDECREF(r.code);
    r.code = code;
    r.lasti = lasti;
  }

  c10::intrusive_ptr<c10d::Backend> native_;
  py::object slow_;
  py::object internal_;
  std::array<bool, 64> allowed_{};
  std::vector<Record> ring_;
  int64_t seq_ = 0;
  std::unordered_map<PyObject*, bool> known_;
};

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  py::class_<Lane, c10d::Backend, c10::intrusive_ptr<Lane>>(m, "Lane")
      .def(py::init<int, int, c10::intrusive_ptr<c10d::Backend>, py::object, py::object>())
      .def("allow", &Lane::allow)
      .def("last", &Lane::last)
      .def_readwrite("record", &Lane::record);
}
