#include "worker/ddp/torch_file.h"

#include <caffe2/serialize/inline_container.h>
#include <fcntl.h>
#include <torch/csrc/jit/serialization/export.h>
#include <torch/csrc/jit/serialization/pickler.h>
#include <torch/serialize.h>
#include <torch/torch.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <map>
#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace gradsync {
namespace {

// Pickle opcodes torch.save (protocol 2) and torch::pickle_save write, and
// the protocol-4 framing ones.
enum Op : uint8_t {
  kMark = '(', kStop = '.', kPop = '0', kPopMark = '1', kDup = '2',
  kBinFloat = 'G', kBinInt = 'J', kBinInt1 = 'K', kBinInt2 = 'M',
  kNone = 'N', kBinPersId = 'Q', kReduce = 'R', kShortBinString = 'U',
  kBinUnicode = 'X', kAppend = 'a', kBuild = 'b', kGlobal = 'c',
  kDict = 'd', kEmptyDict = '}', kAppends = 'e', kBinGet = 'h',
  kLongBinGet = 'j', kList = 'l', kEmptyList = ']', kBinPut = 'q',
  kLongBinPut = 'r', kSetItem = 's', kTuple = 't', kEmptyTuple = ')',
  kSetItems = 'u', kBinBytes = 'B', kShortBinBytes = 'C', kProto = 0x80,
  kTuple1 = 0x85, kTuple2 = 0x86, kTuple3 = 0x87, kNewTrue = 0x88,
  kNewFalse = 0x89, kLong1 = 0x8a, kShortBinUnicode = 0x8c,
  kBinUnicode8 = 0x8d, kStackGlobal = 0x93, kMemoize = 0x94, kFrame = 0x95,
};

// A reference to a Python global (a class or function) on the stack: a
// tuple no file holds by itself.
constexpr char kGlobalTag[] = "\x01gradsync-global";

c10::IValue MakeGlobal(const std::string& module, const std::string& name) {
  return c10::ivalue::Tuple::create({c10::IValue(std::string(kGlobalTag)),
                                     c10::IValue(module), c10::IValue(name)});
}

// "module.name" when `value` is a global, else empty.
std::string GlobalName(const c10::IValue& value) {
  if (!value.isTuple()) return "";
  const auto& elements = value.toTupleRef().elements();
  if (elements.size() != 3 || !elements[0].isString() ||
      elements[0].toStringRef() != kGlobalTag) {
    return "";
  }
  return absl::StrCat(elements[1].toStringRef(), ".", elements[2].toStringRef());
}

std::optional<torch::ScalarType> StorageType(const std::string& global) {
  static const auto* types = new std::map<std::string, torch::ScalarType>{
      {"torch.FloatStorage", torch::kFloat},
      {"torch.DoubleStorage", torch::kDouble},
      {"torch.HalfStorage", torch::kHalf},
      {"torch.BFloat16Storage", torch::kBFloat16},
      {"torch.LongStorage", torch::kLong},
      {"torch.IntStorage", torch::kInt},
      {"torch.ShortStorage", torch::kShort},
      {"torch.CharStorage", torch::kChar},
      {"torch.ByteStorage", torch::kByte},
      {"torch.BoolStorage", torch::kBool},
  };
  auto it = types->find(global);
  if (it == types->end()) return std::nullopt;
  return it->second;
}

std::vector<int64_t> Ints(const c10::IValue& value) {
  std::vector<int64_t> ints;
  if (value.isTuple()) {
    for (const c10::IValue& v : value.toTupleRef().elements()) {
      ints.push_back(v.toInt());
    }
  } else {
    for (const c10::IValue& v : value.toListRef()) ints.push_back(v.toInt());
  }
  return ints;
}

// Runs a pickle program over the archive it came from. Single use.
class Unpickler {
 public:
  Unpickler(std::string data, caffe2::serialize::PyTorchStreamReader* archive)
      : data_(std::move(data)), archive_(archive) {}

  absl::StatusOr<c10::IValue> Run() {
    try {
      for (;;) {
        GS_ASSIGN_OR_RETURN(uint8_t op, Byte());
        if (op == kStop) break;
        GS_RETURN_IF_ERROR(Step(op));
      }
      if (stack_.size() != 1 || !stack_.back().has_value()) {
        return Corrupt("the pickle does not end with one object");
      }
      return *stack_.back();
    } catch (const c10::Error& e) {
      return Corrupt(e.what_without_backtrace());
    }
  }

 private:
  absl::Status Corrupt(const std::string& what) const {
    return absl::DataLossError(absl::StrCat(what, " (at byte ", at_, ")"));
  }

  absl::StatusOr<std::string> Bytes(size_t n) {
    if (data_.size() - at_ < n) return Corrupt("the pickle ends early");
    std::string out = data_.substr(at_, n);
    at_ += n;
    return out;
  }
  absl::StatusOr<uint8_t> Byte() {
    GS_ASSIGN_OR_RETURN(std::string b, Bytes(1));
    return static_cast<uint8_t>(b[0]);
  }
  // Little-endian unsigned of `n` bytes.
  absl::StatusOr<uint64_t> Unsigned(size_t n) {
    GS_ASSIGN_OR_RETURN(std::string b, Bytes(n));
    uint64_t value = 0;
    for (size_t i = n; i-- > 0;) value = value << 8 | static_cast<uint8_t>(b[i]);
    return value;
  }
  absl::StatusOr<std::string> Line() {
    const size_t end = data_.find('\n', at_);
    if (end == std::string::npos) return Corrupt("unterminated line");
    std::string line = data_.substr(at_, end - at_);
    at_ = end + 1;
    return line;
  }

  void Push(c10::IValue value) { stack_.emplace_back(std::move(value)); }
  absl::StatusOr<c10::IValue> Pop() {
    if (stack_.empty() || !stack_.back().has_value()) {
      return Corrupt("stack underflow");
    }
    c10::IValue value = std::move(*stack_.back());
    stack_.pop_back();
    return value;
  }
  // Everything above the topmost mark, which is removed.
  absl::StatusOr<std::vector<c10::IValue>> PopToMark() {
    std::vector<c10::IValue> items;
    while (!stack_.empty() && stack_.back().has_value()) {
      items.push_back(std::move(*stack_.back()));
      stack_.pop_back();
    }
    if (stack_.empty()) return Corrupt("no mark on the stack");
    stack_.pop_back();
    std::reverse(items.begin(), items.end());
    return items;
  }
  absl::StatusOr<c10::IValue*> Top() {
    if (stack_.empty() || !stack_.back().has_value()) {
      return Corrupt("stack underflow");
    }
    return &*stack_.back();
  }

  absl::Status SetItems(c10::IValue* dict, std::vector<c10::IValue> items) {
    if (!dict->isGenericDict() || items.size() % 2 != 0) {
      return Corrupt("SETITEMS on something that is not a dict");
    }
    c10::impl::GenericDict d = dict->toGenericDict();
    for (size_t i = 0; i < items.size(); i += 2) {
      d.insert_or_assign(std::move(items[i]), std::move(items[i + 1]));
    }
    return absl::OkStatus();
  }
  absl::Status Appends(c10::IValue* list, std::vector<c10::IValue> items) {
    if (!list->isList()) return Corrupt("APPENDS on something that is not a list");
    c10::List<c10::IValue> l = list->toList();
    for (c10::IValue& item : items) l.push_back(std::move(item));
    return absl::OkStatus();
  }
  absl::Status Put(uint64_t key) {
    GS_ASSIGN_OR_RETURN(c10::IValue * top, Top());
    memo_[key] = *top;
    return absl::OkStatus();
  }
  absl::Status Get(uint64_t key) {
    auto it = memo_.find(key);
    if (it == memo_.end()) return Corrupt("memo key not found");
    Push(it->second);
    return absl::OkStatus();
  }

  static c10::impl::GenericDict NewDict() {
    return c10::impl::GenericDict(c10::AnyType::get(), c10::AnyType::get());
  }
  static c10::IValue NewList() {
    return c10::IValue(c10::impl::GenericList(c10::AnyType::get()));
  }

  // A storage record: ('storage', torch.<Type>Storage, key, location, numel)
  // -> a flat CPU tensor over it.
  absl::StatusOr<c10::IValue> Storage(const c10::IValue& pid) {
    if (!pid.isTuple() || pid.toTupleRef().elements().size() < 5) {
      return Corrupt("unknown persistent id");
    }
    const auto& e = pid.toTupleRef().elements();
    const std::string type = GlobalName(e[1]);
    std::optional<torch::ScalarType> dtype = StorageType(type);
    if (!e[0].isString() || e[0].toStringRef() != "storage" || !dtype ||
        !e[2].isString()) {
      return Corrupt(absl::StrCat("unsupported storage ", type));
    }
    const std::string key = e[2].toStringRef();
    auto cached = storages_.find(key);
    if (cached != storages_.end()) return cached->second;
    const std::string record = "data/" + key;
    if (!archive_->hasRecord(record)) {
      return Corrupt(absl::StrCat("the archive has no record ", record));
    }
    auto [data, size] = archive_->getRecord(record);
    const int64_t numel = e[4].toInt();
    const size_t element = c10::elementSize(*dtype);
    if (size != static_cast<size_t>(numel) * element) {
      return Corrupt(absl::StrCat("record ", record, " has ", size,
                                  " bytes for ", numel, " elements"));
    }
    torch::Tensor flat = torch::empty({numel}, torch::dtype(*dtype));
    std::memcpy(flat.data_ptr(), data.get(), size);
    storages_[key] = flat;
    return c10::IValue(flat);
  }

  // What calling `callable` with `args` builds.
  absl::StatusOr<c10::IValue> Call(const c10::IValue& callable,
                                   const c10::IValue& args) {
    const std::string name = GlobalName(callable);
    if (!args.isTuple()) return Corrupt(absl::StrCat("call of ", name));
    const auto& a = args.toTupleRef().elements();
    if (name == "collections.OrderedDict") {
      c10::impl::GenericDict dict = NewDict();
      if (!a.empty() && a[0].isList()) {  // OrderedDict([(k, v), ...])
        for (const c10::IValue& pair : a[0].toListRef()) {
          const auto& kv = pair.toTupleRef().elements();
          dict.insert_or_assign(kv.at(0), kv.at(1));
        }
      }
      return c10::IValue(dict);
    }
    if (name == "torch._utils._rebuild_tensor_v2" && a.size() >= 4 &&
        a[0].isTensor()) {
      torch::Tensor tensor =
          a[0].toTensor().as_strided(Ints(a[2]), Ints(a[3]), a[1].toInt());
      if (a.size() > 4 && a[4].isBool() && a[4].toBool()) {
        tensor.set_requires_grad(true);
      }
      return c10::IValue(tensor);
    }
    if (name == "torch._utils._rebuild_parameter" && !a.empty() &&
        a[0].isTensor()) {
      return a[0];
    }
    // torch::pickle_save's typed containers: the container itself.
    if ((name == "torch.jit._pickle.build_intlist" ||
         name == "torch.jit._pickle.build_doublelist" ||
         name == "torch.jit._pickle.build_boollist" ||
         name == "torch.jit._pickle.build_tensorlist" ||
         name == "torch.jit._pickle.restore_type_tag") &&
        !a.empty()) {
      return a[0];
    }
    return Corrupt(absl::StrCat("unsupported object ", name,
                                " (only dicts, lists, tuples, tensors and "
                                "scalars are read)"));
  }

  absl::Status Step(uint8_t op) {
    switch (op) {
      case kProto: return Bytes(1).status();
      case kFrame: return Bytes(8).status();
      case kMark: stack_.emplace_back(std::nullopt); return absl::OkStatus();
      case kPop: return Pop().status();
      case kPopMark: return PopToMark().status();
      case kDup: {
        GS_ASSIGN_OR_RETURN(c10::IValue * top, Top());
        Push(*top);
        return absl::OkStatus();
      }
      case kNone: Push(c10::IValue()); return absl::OkStatus();
      case kNewTrue: Push(true); return absl::OkStatus();
      case kNewFalse: Push(false); return absl::OkStatus();
      case kBinInt: {
        GS_ASSIGN_OR_RETURN(uint64_t v, Unsigned(4));
        Push(static_cast<int64_t>(static_cast<int32_t>(v)));
        return absl::OkStatus();
      }
      case kBinInt1: {
        GS_ASSIGN_OR_RETURN(uint64_t v, Unsigned(1));
        Push(static_cast<int64_t>(v));
        return absl::OkStatus();
      }
      case kBinInt2: {
        GS_ASSIGN_OR_RETURN(uint64_t v, Unsigned(2));
        Push(static_cast<int64_t>(v));
        return absl::OkStatus();
      }
      case kLong1: {
        GS_ASSIGN_OR_RETURN(uint64_t n, Unsigned(1));
        if (n > 8) return Corrupt("integer wider than 64 bits");
        GS_ASSIGN_OR_RETURN(uint64_t v, Unsigned(n));
        if (n > 0 && n < 8 && (v >> (8 * n - 1)) != 0) {
          v |= ~uint64_t{0} << (8 * n);  // sign-extend
        }
        Push(static_cast<int64_t>(v));
        return absl::OkStatus();
      }
      case kBinFloat: {
        GS_ASSIGN_OR_RETURN(std::string b, Bytes(8));
        uint64_t bits = 0;
        for (char c : b) bits = bits << 8 | static_cast<uint8_t>(c);  // big-endian
        double d;
        std::memcpy(&d, &bits, sizeof(d));
        Push(d);
        return absl::OkStatus();
      }
      case kShortBinUnicode:
      case kShortBinString:
      case kShortBinBytes:
      case kBinUnicode:
      case kBinBytes:
      case kBinUnicode8: {
        const size_t width = op == kBinUnicode8 ? 8
                             : (op == kBinUnicode || op == kBinBytes) ? 4
                                                                      : 1;
        GS_ASSIGN_OR_RETURN(uint64_t n, Unsigned(width));
        GS_ASSIGN_OR_RETURN(std::string s, Bytes(n));
        Push(c10::IValue(std::move(s)));
        return absl::OkStatus();
      }
      case kEmptyTuple: Push(c10::ivalue::Tuple::create({})); return absl::OkStatus();
      case kTuple1:
      case kTuple2:
      case kTuple3: {
        std::vector<c10::IValue> items(op - kTuple1 + 1);
        for (size_t i = items.size(); i-- > 0;) {
          GS_ASSIGN_OR_RETURN(items[i], Pop());
        }
        Push(c10::ivalue::Tuple::create(std::move(items)));
        return absl::OkStatus();
      }
      case kTuple: {
        GS_ASSIGN_OR_RETURN(std::vector<c10::IValue> items, PopToMark());
        Push(c10::ivalue::Tuple::create(std::move(items)));
        return absl::OkStatus();
      }
      case kEmptyList: Push(NewList()); return absl::OkStatus();
      case kList: {
        GS_ASSIGN_OR_RETURN(std::vector<c10::IValue> items, PopToMark());
        c10::IValue list = NewList();
        GS_RETURN_IF_ERROR(Appends(&list, std::move(items)));
        Push(std::move(list));
        return absl::OkStatus();
      }
      case kAppend: {
        GS_ASSIGN_OR_RETURN(c10::IValue item, Pop());
        GS_ASSIGN_OR_RETURN(c10::IValue * list, Top());
        return Appends(list, {std::move(item)});
      }
      case kAppends: {
        GS_ASSIGN_OR_RETURN(std::vector<c10::IValue> items, PopToMark());
        GS_ASSIGN_OR_RETURN(c10::IValue * list, Top());
        return Appends(list, std::move(items));
      }
      case kEmptyDict: Push(c10::IValue(NewDict())); return absl::OkStatus();
      case kDict: {
        GS_ASSIGN_OR_RETURN(std::vector<c10::IValue> items, PopToMark());
        c10::IValue dict(NewDict());
        GS_RETURN_IF_ERROR(SetItems(&dict, std::move(items)));
        Push(std::move(dict));
        return absl::OkStatus();
      }
      case kSetItem: {
        GS_ASSIGN_OR_RETURN(c10::IValue value, Pop());
        GS_ASSIGN_OR_RETURN(c10::IValue key, Pop());
        GS_ASSIGN_OR_RETURN(c10::IValue * dict, Top());
        return SetItems(dict, {std::move(key), std::move(value)});
      }
      case kSetItems: {
        GS_ASSIGN_OR_RETURN(std::vector<c10::IValue> items, PopToMark());
        GS_ASSIGN_OR_RETURN(c10::IValue * dict, Top());
        return SetItems(dict, std::move(items));
      }
      case kBinPut: {
        GS_ASSIGN_OR_RETURN(uint64_t key, Unsigned(1));
        return Put(key);
      }
      case kLongBinPut: {
        GS_ASSIGN_OR_RETURN(uint64_t key, Unsigned(4));
        return Put(key);
      }
      case kMemoize: return Put(memo_.size());
      case kBinGet: {
        GS_ASSIGN_OR_RETURN(uint64_t key, Unsigned(1));
        return Get(key);
      }
      case kLongBinGet: {
        GS_ASSIGN_OR_RETURN(uint64_t key, Unsigned(4));
        return Get(key);
      }
      case kGlobal: {
        GS_ASSIGN_OR_RETURN(std::string module, Line());
        GS_ASSIGN_OR_RETURN(std::string name, Line());
        Push(MakeGlobal(module, name));
        return absl::OkStatus();
      }
      case kStackGlobal: {
        GS_ASSIGN_OR_RETURN(c10::IValue name, Pop());
        GS_ASSIGN_OR_RETURN(c10::IValue module, Pop());
        if (!name.isString() || !module.isString()) {
          return Corrupt("STACK_GLOBAL without names");
        }
        Push(MakeGlobal(module.toStringRef(), name.toStringRef()));
        return absl::OkStatus();
      }
      case kReduce: {
        GS_ASSIGN_OR_RETURN(c10::IValue args, Pop());
        GS_ASSIGN_OR_RETURN(c10::IValue callable, Pop());
        GS_ASSIGN_OR_RETURN(c10::IValue result, Call(callable, args));
        Push(std::move(result));
        return absl::OkStatus();
      }
      case kBuild:
        // State set on an object: an OrderedDict's _metadata, a tensor's
        // Python attributes. Nothing a state dict needs.
        return Pop().status();
      case kBinPersId: {
        GS_ASSIGN_OR_RETURN(c10::IValue pid, Pop());
        GS_ASSIGN_OR_RETURN(c10::IValue storage, Storage(pid));
        Push(std::move(storage));
        return absl::OkStatus();
      }
      default:
        return Corrupt(absl::StrCat("unsupported pickle opcode 0x",
                                    absl::Hex(op)));
    }
  }

  const std::string data_;
  caffe2::serialize::PyTorchStreamReader* const archive_;
  size_t at_ = 0;
  // std::nullopt marks MARK.
  std::vector<std::optional<c10::IValue>> stack_;
  std::map<uint64_t, c10::IValue> memo_;
  std::map<std::string, c10::IValue> storages_;
};

// Writes all of `bytes` to `fd`.
bool WriteAll(int fd, const std::vector<char>& bytes) {
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    done += static_cast<size_t>(n);
  }
  return true;
}

// `value` with every list a generic one, recursively: torch::pickle_save
// writes typed lists through torch.jit._pickle's build_intlist and the like,
// globals that torch.load(weights_only=True) refuses (PyTorch's default from
// 2.6); generic lists are plain pickle lists.
c10::IValue PlainContainers(const c10::IValue& value) {
  if (value.isList()) {
    c10::impl::GenericList list(c10::AnyType::get());
    for (const c10::IValue& item : value.toListRef()) {
      list.push_back(PlainContainers(item));
    }
    return list;
  }
  if (value.isGenericDict()) {
    const c10::impl::GenericDict dict = value.toGenericDict();
    c10::impl::GenericDict plain(dict.keyType(), c10::AnyType::get());
    for (const auto& item : dict) {
      plain.insert(item.key(), PlainContainers(item.value()));
    }
    return plain;
  }
  if (value.isTuple()) {
    std::vector<c10::IValue> items;
    for (const c10::IValue& item : value.toTupleRef().elements()) {
      items.push_back(PlainContainers(item));
    }
    return c10::ivalue::Tuple::create(std::move(items));
  }
  return value;
}

// The zip archive torch::pickle_save writes (data.pkl and a record per
// storage), without its type tags: lists and dicts as plain pickle ones, so
// that torch.load(weights_only=True) reads it.
std::vector<char> PickleSave(const c10::IValue& value) {
  std::vector<char> pickle;
  torch::jit::Pickler pickler(
      [&](const char* bytes, size_t size) {
        pickle.insert(pickle.end(), bytes, bytes + size);
      },
      /*tensor_table=*/nullptr, /*type_renamer=*/nullptr,
      /*memoized_class_types=*/nullptr, /*get_tensor_id=*/nullptr,
      /*tag_aggregates=*/false);
  pickler.protocol();
  pickler.pushIValue(PlainContainers(value));
  pickler.stop();
  std::vector<char> archive;
  caffe2::serialize::PyTorchStreamWriter writer(
      [&](const void* bytes, size_t size) {
        const char* begin = static_cast<const char*>(bytes);
        archive.insert(archive.end(), begin, begin + size);
        return size;
      });
  torch::jit::writeArchiveAndTensors("data", pickle.data(), pickle.size(),
                                     pickler.tensorData(), writer);
  writer.writeEndOfFile();
  return archive;
}

}  // namespace

absl::StatusOr<c10::IValue> ReadTorchFile(const std::string& path) {
  if (::access(path.c_str(), R_OK) != 0) {
    return absl::NotFoundError(absl::StrCat("cannot open ", path, ": ",
                                            std::strerror(errno)));
  }
  std::unique_ptr<caffe2::serialize::PyTorchStreamReader> archive;
  std::string pickle;
  try {
    archive = std::make_unique<caffe2::serialize::PyTorchStreamReader>(path);
    auto [data, size] = archive->getRecord("data.pkl");
    pickle.assign(static_cast<const char*>(data.get()), size);
  } catch (const c10::Error& e) {
    return absl::DataLossError(absl::StrCat(
        path, " is not a file torch.save wrote (zip format): ",
        e.what_without_backtrace()));
  }
  absl::StatusOr<c10::IValue> value = Unpickler(pickle, archive.get()).Run();
  if (!value.ok()) {
    return absl::DataLossError(
        absl::StrCat("cannot read ", path, ": ", value.status().message()));
  }
  return value;
}

absl::Status WriteTorchFile(const c10::IValue& value, const std::string& path) {
  std::vector<char> bytes;
  try {
    bytes = PickleSave(value);
  } catch (const c10::Error& e) {
    return absl::InternalError(absl::StrCat("cannot serialize for ", path, ": ",
                                            e.what_without_backtrace()));
  }
  const std::string temporary = absl::StrCat(path, ".tmp.", ::getpid());
  const int fd =
      ::open(temporary.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    return absl::InternalError(absl::StrCat("cannot write ", temporary, ": ",
                                            std::strerror(errno)));
  }
  const bool written = WriteAll(fd, bytes) && ::fsync(fd) == 0;
  const int error = errno;
  ::close(fd);
  if (!written || ::rename(temporary.c_str(), path.c_str()) != 0) {
    const int cause = written ? errno : error;
    ::unlink(temporary.c_str());
    return absl::InternalError(absl::StrCat("cannot write ", path, ": ",
                                            std::strerror(cause)));
  }
  // The rename is durable once the directory is.
  const size_t slash = path.rfind('/');
  const std::string dir = slash == std::string::npos ? "." : path.substr(0, slash + 1);
  const int dir_fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir_fd >= 0) {
    ::fsync(dir_fd);
    ::close(dir_fd);
  }
  return absl::OkStatus();
}

}  // namespace gradsync
