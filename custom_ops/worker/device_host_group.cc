#include "device_host_group.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "../common/reduce.h"
#include "device_api.h"

namespace bps {
namespace {

// The segment's name: the id's first 16 bytes in hex.
std::string SegmentName(const void* id) {
  static const char kHex[] = "0123456789abcdef";
  const auto* bytes = static_cast<const unsigned char*>(id);
  std::string name = "/bps-group-";
  for (int i = 0; i < 16; ++i) {
    name += kHex[bytes[i] >> 4];
    name += kHex[bytes[i] & 15];
  }
  return name;
}

}  // namespace

void HostGroup::MakeId(void* id) {
  std::random_device random;
  auto* bytes = static_cast<unsigned char*>(id);
  std::memset(bytes, 0, BPS_GROUP_ID_BYTES);
  for (int i = 0; i < 16; ++i) bytes[i] = static_cast<unsigned char>(random());
}

Status HostGroup::Open(const void* id, int size, int member, std::chrono::milliseconds wait,
                       HostGroup** group) {
  if (size < 1 || member < 0 || member >= size)
    return Status::Error("member " + std::to_string(member) + " of a group of " +
                         std::to_string(size));
  const std::string name = SegmentName(id);
  const size_t bytes = sizeof(Control) + static_cast<size_t>(size) * kChunk;
  const int fd = shm_open(name.c_str(), O_CREAT | O_RDWR, 0600);
  if (fd < 0) return Status::Error("shm_open " + name + ": " + std::strerror(errno));
  // Every member sizes it alike: whoever maps it first finds it whole.
  void* mapping = MAP_FAILED;
  if (ftruncate(fd, static_cast<off_t>(bytes)) == 0)
    mapping = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  const int error = errno;
  close(fd);
  if (mapping == MAP_FAILED) {
    shm_unlink(name.c_str());
    return Status::Error("mapping " + name + ": " + std::strerror(error));
  }
  auto* made = new HostGroup(mapping, bytes, size, member, wait);
  Status status = made->Barrier("opening");
  if (member == 0) shm_unlink(name.c_str());  // all mapped it, or the open failed
  if (!status.ok()) {
    delete made;
    return status;
  }
  *group = made;
  return Status::OK();
}

HostGroup::HostGroup(void* mapping, size_t bytes, int size, int member,
                     std::chrono::milliseconds wait)
    : mapping_(mapping),
      bytes_(bytes),
      control_(static_cast<Control*>(mapping)),
      size_(size),
      member_(member),
      wait_(wait) {}

HostGroup::~HostGroup() { munmap(mapping_, bytes_); }

char* HostGroup::slot(int member) const {
  return static_cast<char*>(mapping_) + sizeof(Control) + static_cast<size_t>(member) * kChunk;
}

std::string HostGroup::broken() const {
  return is_broken_.load(std::memory_order_acquire) ? broken_ : std::string();
}

Status HostGroup::Break(std::string why) {
  broken_ = std::move(why);
  is_broken_.store(true, std::memory_order_release);
  return Status::Error(broken_);
}

Status HostGroup::Barrier(const char* during) {
  if (is_broken_.load(std::memory_order_acquire)) return Status::Error(broken_);
  // Sense by generation: the last to arrive resets the count, then opens the next one.
  const uint32_t generation = control_->generation.load(std::memory_order_acquire);
  if (control_->arrived.fetch_add(1, std::memory_order_acq_rel) + 1 ==
      static_cast<uint32_t>(size_)) {
    control_->arrived.store(0, std::memory_order_relaxed);
    control_->generation.fetch_add(1, std::memory_order_release);
    return Status::OK();
  }
  const auto deadline = std::chrono::steady_clock::now() + wait_;
  for (int spins = 0; control_->generation.load(std::memory_order_acquire) == generation;
       ++spins) {
    if (aborted_.load()) return Break("the group was aborted " + std::string(during));
    if (spins > 100) std::this_thread::sleep_for(std::chrono::microseconds(50));
    if ((spins & 255) == 0 && std::chrono::steady_clock::now() > deadline)
      return Break("member " + std::to_string(member_) + " of the stand-in group waited " +
                   std::to_string(wait_.count()) + " ms for the others " + during);
  }
  return Status::OK();
}

Status HostGroup::Reduce(const void* src, void* dst, size_t count, DataType dtype, ReduceOp op,
                         int root) {
  const size_t element = DataTypeSize(dtype);
  const size_t bytes = count * element;
  const size_t chunk = kChunk / element * element;
  std::vector<const char*> inputs(size_);
  for (int m = 0; m < size_; ++m) inputs[m] = slot(m);
  for (size_t offset = 0; offset < bytes; offset += chunk) {
    const size_t length = std::min(chunk, bytes - offset);
    std::memcpy(slot(member_), static_cast<const char*>(src) + offset, length);
    Status status = Barrier("in a reduce");
    if (status.ok() && member_ == root)
      ReduceAll(op, dtype, static_cast<char*>(dst) + offset, inputs, length / element);
    if (status.ok()) status = Barrier("in a reduce");
    if (!status.ok()) return status;
  }
  return Status::OK();
}

Status HostGroup::Broadcast(void* buf, size_t count, DataType dtype, int root) {
  const size_t bytes = count * DataTypeSize(dtype);
  for (size_t offset = 0; offset < bytes; offset += kChunk) {
    const size_t length = std::min(kChunk, bytes - offset);
    char* at = static_cast<char*>(buf) + offset;
    if (member_ == root) std::memcpy(slot(root), at, length);
    Status status = Barrier("in a broadcast");
    if (status.ok() && member_ != root) std::memcpy(at, slot(root), length);
    if (status.ok()) status = Barrier("in a broadcast");
    if (!status.ok()) return status;
  }
  return Status::OK();
}

}  // namespace bps
