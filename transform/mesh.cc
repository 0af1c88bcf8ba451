#include "transform/mesh.h"

#include <cctype>

namespace tessera {
namespace {

bool IsIdentifier(std::string_view s) {
  if (s.empty() || !(std::isalpha(static_cast<unsigned char>(s[0])) || s[0] == '_')) return false;
  for (char c : s) {
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_')) return false;
  }
  return true;
}

}  // namespace

Result<Mesh> Mesh::Create(std::vector<std::string> names, std::vector<int64_t> sizes) {
  if (names.size() != sizes.size()) {
    return InvalidArgumentError("mesh: " + std::to_string(names.size()) + " axis names but " +
                                std::to_string(sizes.size()) + " sizes");
  }
  Mesh m;
  int64_t world = 1;
  for (size_t i = 0; i < names.size(); ++i) {
    if (!IsIdentifier(names[i])) {
      return InvalidArgumentError("mesh: axis name '" + names[i] +
                                  "' is not an identifier ([A-Za-z_][A-Za-z0-9_]*)");
    }
    for (size_t j = 0; j < i; ++j) {
      if (names[j] == names[i]) {
        return InvalidArgumentError("mesh: axis '" + names[i] + "' appears twice");
      }
    }
    if (sizes[i] < 1) {
      return InvalidArgumentError("mesh: axis '" + names[i] + "' has size " +
                                  std::to_string(sizes[i]) + " (must be >= 1)");
    }
    if (world > kMaxWorldSize / sizes[i]) {
      return InvalidArgumentError("mesh: world size exceeds " + std::to_string(kMaxWorldSize) +
                                  " ranks");
    }
    world *= sizes[i];
  }
  m.names_ = std::move(names);
  m.sizes_ = std::move(sizes);
  m.world_size_ = world;
  m.strides_.assign(m.sizes_.size(), 1);
  for (int i = static_cast<int>(m.sizes_.size()) - 2; i >= 0; --i) {
    m.strides_[i] = m.strides_[i + 1] * m.sizes_[i + 1];
  }
  return m;
}

Result<Mesh> Mesh::Parse(std::string_view text) {
  std::vector<std::string> names;
  std::vector<int64_t> sizes;
  while (!text.empty()) {
    size_t comma = text.find(',');
    std::string_view item = text.substr(0, comma);
    text = comma == std::string_view::npos ? std::string_view() : text.substr(comma + 1);
    size_t eq = item.find('=');
    if (eq == std::string_view::npos || eq == 0 || eq + 1 == item.size()) {
      return InvalidArgumentError("mesh '" + std::string(item) +
                                  "': expected axis=size, e.g. dp=2,tp=4");
    }
    int64_t size = 0;
    for (char c : item.substr(eq + 1)) {
      if (!std::isdigit(static_cast<unsigned char>(c)) || size > kMaxWorldSize) {
        return InvalidArgumentError("mesh '" + std::string(item) + "': size is not a number");
      }
      size = size * 10 + (c - '0');
    }
    names.emplace_back(item.substr(0, eq));
    sizes.push_back(size);
  }
  return Create(std::move(names), std::move(sizes));
}

int Mesh::FindAxis(std::string_view name) const {
  for (int i = 0; i < ndim(); ++i) {
    if (names_[i] == name) return i;
  }
  return -1;
}

std::vector<int64_t> Mesh::Coordinates(int64_t rank) const {
  std::vector<int64_t> c(sizes_.size());
  for (int i = ndim() - 1; i >= 0; --i) {
    c[i] = rank % sizes_[i];
    rank /= sizes_[i];
  }
  return c;
}

int64_t Mesh::Coordinate(int64_t rank, int axis) const {
  return (rank / strides_[axis]) % sizes_[axis];
}

int64_t Mesh::RankOf(const std::vector<int64_t>& coordinates) const {
  int64_t r = 0;
  for (int i = 0; i < ndim(); ++i) r += coordinates[i] * strides_[i];
  return r;
}

std::string Mesh::ToString() const {
  std::string s = "[";
  for (int i = 0; i < ndim(); ++i) {
    if (i) s += ", ";
    s += names_[i] + "=" + std::to_string(sizes_[i]);
  }
  return s + "]";
}

}  // namespace tessera
