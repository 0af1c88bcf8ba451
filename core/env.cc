#include "core/env.h"

#include <algorithm>
#include <cstring>

namespace tessera {

std::string Dirname(std::string_view path) {
  while (path.size() > 1 && path.back() == '/') path.remove_suffix(1);
  size_t pos = path.rfind('/');
  if (pos == std::string_view::npos) return ".";
  if (pos == 0) return "/";
  return std::string(path.substr(0, pos));
}

std::string JoinPath(std::string_view a, std::string_view b) {
  if (a.empty()) return std::string(b);
  std::string out(a);
  if (out.back() != '/') out += '/';
  while (!b.empty() && b.front() == '/') b.remove_prefix(1);
  out += b;
  return out;
}

Result<std::string> ReadFileToString(Env* env, const std::string& path) {
  ASSIGN_OR_RETURN(auto file, env->NewRandomAccessFile(path));
  ASSIGN_OR_RETURN(uint64_t size, file->Size());
  std::string data(size, '\0');
  RETURN_IF_ERROR(file->Read(0, size, data.data()));
  return data;
}

Status WriteFileAtomically(Env* env, const std::string& path, std::string_view data) {
  return WriteFileAtomically(env, path, std::span<const std::string_view>(&data, 1));
}

Status WriteFileAtomically(Env* env, const std::string& path,
                           std::span<const std::string_view> parts) {
  const std::string tmp = path + ".tmp";
  auto write_tmp = [&]() -> Status {
    ASSIGN_OR_RETURN(auto file, env->NewWritableFile(tmp));
    for (std::string_view part : parts) {
      if (!part.empty()) RETURN_IF_ERROR(file->Append(part.data(), part.size()));
    }
    RETURN_IF_ERROR(file->Sync());
    return file->Close();
  };
  Status s = write_tmp();
  if (s.ok()) s = env->RenameFile(tmp, path);
  if (!s.ok()) {
    if (env->FileExists(tmp)) (void)env->DeleteFile(tmp);  // never leave a half-written file
    return s;
  }
  return env->SyncDir(Dirname(path));
}

Status DeleteRecursively(Env* env, const std::string& path) {
  if (!env->IsDirectory(path)) return env->DeleteFile(path);
  ASSIGN_OR_RETURN(auto children, env->GetChildren(path));
  for (const std::string& child : children) {
    RETURN_IF_ERROR(DeleteRecursively(env, JoinPath(path, child)));
  }
  return env->DeleteDir(path);
}

// ---------------------------------------------------------------------------
// MemEnv

namespace {

struct MemFile {
  std::mutex mu;
  std::string data;
};

class MemEnvImpl;

class MemWritableFile : public WritableFile {
 public:
  MemWritableFile(std::shared_ptr<MemFile> file) : file_(std::move(file)) {}
  Status Append(const void* data, size_t size) override {
    std::lock_guard<std::mutex> lock(file_->mu);
    file_->data.append(static_cast<const char*>(data), size);
    return Status::Ok();
  }
  Status WriteAt(uint64_t offset, const void* data, size_t size) override {
    std::lock_guard<std::mutex> lock(file_->mu);
    if (file_->data.size() < offset + size) file_->data.resize(offset + size, '\0');
    if (size > 0) std::memcpy(file_->data.data() + offset, data, size);  // data may be null then
    return Status::Ok();
  }
  Status Sync() override { return Status::Ok(); }
  Status Close() override { return Status::Ok(); }

 private:
  std::shared_ptr<MemFile> file_;
};

class MemRandomAccessFile : public RandomAccessFile {
 public:
  MemRandomAccessFile(std::string path, std::shared_ptr<MemFile> file)
      : path_(std::move(path)), file_(std::move(file)) {}
  Status Read(uint64_t offset, size_t size, void* dst) const override {
    std::lock_guard<std::mutex> lock(file_->mu);
    if (offset + size > file_->data.size()) {
      return DataLossError("file '" + path_ + "': read of " + std::to_string(size) +
                           " bytes at offset " + std::to_string(offset) + " past its end (" +
                           std::to_string(file_->data.size()) + " bytes)");
    }
    if (size > 0) std::memcpy(dst, file_->data.data() + offset, size);  // dst may be null then
    return Status::Ok();
  }
  Result<uint64_t> Size() const override {
    std::lock_guard<std::mutex> lock(file_->mu);
    return static_cast<uint64_t>(file_->data.size());
  }

 private:
  std::string path_;
  std::shared_ptr<MemFile> file_;
};

std::string Normalize(std::string_view path) {
  std::string p(path);
  while (p.size() > 1 && p.back() == '/') p.pop_back();
  return p;
}

bool AtOrUnder(const std::string& path, const std::string& dir) {
  return path == dir || path.rfind(dir + "/", 0) == 0;
}

// Renames every key that is `from` or lies under `from`/ to the same place
// under `to` (a directory rename).
template <typename Map>
void MovePrefix(Map* m, const std::string& from, const std::string& to) {
  Map moved;
  for (auto it = m->begin(); it != m->end();) {
    if (AtOrUnder(it->first, from)) {
      moved.emplace(to + it->first.substr(from.size()), std::move(it->second));
      it = m->erase(it);
    } else {
      ++it;
    }
  }
  for (auto& kv : moved) (*m)[kv.first] = std::move(kv.second);
}

// The same for a set of paths.
void MovePrefix(std::set<std::string>* paths, const std::string& from, const std::string& to) {
  std::vector<std::string> moved;
  for (auto it = paths->begin(); it != paths->end();) {
    if (AtOrUnder(*it, from)) {
      moved.push_back(to + it->substr(from.size()));
      it = paths->erase(it);
    } else {
      ++it;
    }
  }
  paths->insert(moved.begin(), moved.end());
}

class MemEnvImpl : public Env {
 public:
  Result<std::unique_ptr<WritableFile>> NewWritableFile(const std::string& path) override {
    std::lock_guard<std::mutex> lock(mu_);
    const std::string p = Normalize(path);
    if (!ParentExistsLocked(p)) return NotFoundError("open '" + path + "': no such directory");
    auto file = std::make_shared<MemFile>();
    files_[p] = file;
    return std::unique_ptr<WritableFile>(new MemWritableFile(file));
  }
  Result<std::unique_ptr<WritableFile>> OpenWritableFile(const std::string& path) override {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = files_.find(Normalize(path));
    if (it == files_.end()) return NotFoundError("open '" + path + "': no such file");
    return std::unique_ptr<WritableFile>(new MemWritableFile(it->second));
  }
  Result<std::unique_ptr<RandomAccessFile>> NewRandomAccessFile(const std::string& path) override {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = files_.find(Normalize(path));
    if (it == files_.end()) return NotFoundError("open '" + path + "': no such file");
    return std::unique_ptr<RandomAccessFile>(new MemRandomAccessFile(path, it->second));
  }
  bool FileExists(const std::string& path) override {
    std::lock_guard<std::mutex> lock(mu_);
    const std::string p = Normalize(path);
    return files_.count(p) > 0 || dirs_.count(p) > 0;
  }
  Result<uint64_t> GetFileSize(const std::string& path) override {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = files_.find(Normalize(path));
    if (it == files_.end()) return NotFoundError("stat '" + path + "': no such file");
    std::lock_guard<std::mutex> flock(it->second->mu);
    return static_cast<uint64_t>(it->second->data.size());
  }
  Status RenameFile(const std::string& from, const std::string& to) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (!ParentExistsLocked(Normalize(to))) {
      return NotFoundError("rename to '" + to + "': no such directory");
    }
    if (dirs_.count(Normalize(from))) return RenameDirLocked(Normalize(from), Normalize(to));
    auto it = files_.find(Normalize(from));
    if (it == files_.end()) return NotFoundError("rename '" + from + "': no such file");
    auto file = it->second;
    files_.erase(it);
    files_[Normalize(to)] = file;
    return Status::Ok();
  }
  Status DeleteFile(const std::string& path) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (files_.erase(Normalize(path)) == 0) {
      return NotFoundError("delete '" + path + "': no such file");
    }
    return Status::Ok();
  }
  Status CreateDirs(const std::string& path) override {
    std::lock_guard<std::mutex> lock(mu_);
    std::string p = Normalize(path);
    while (!p.empty() && p != "." && p != "/") {
      if (files_.count(p)) return IOError("mkdir '" + path + "': '" + p + "' is a file");
      dirs_.insert(p);
      p = Dirname(p);
    }
    return Status::Ok();
  }
  Status DeleteDir(const std::string& path) override {
    std::lock_guard<std::mutex> lock(mu_);
    const std::string p = Normalize(path);
    if (!dirs_.count(p)) return NotFoundError("rmdir '" + path + "': no such directory");
    if (!ChildrenLocked(p).empty()) return IOError("rmdir '" + path + "': not empty");
    dirs_.erase(p);
    return Status::Ok();
  }
  Result<std::vector<std::string>> GetChildren(const std::string& dir) override {
    std::lock_guard<std::mutex> lock(mu_);
    const std::string p = Normalize(dir);
    if (!dirs_.count(p)) return NotFoundError("list '" + dir + "': no such directory");
    return ChildrenLocked(p);
  }
  bool IsDirectory(const std::string& path) override {
    std::lock_guard<std::mutex> lock(mu_);
    return dirs_.count(Normalize(path)) > 0;
  }
  Status SyncDir(const std::string&) override { return Status::Ok(); }

 private:
  // rename(2) of a directory: the target must not exist or be empty.
  Status RenameDirLocked(const std::string& from, const std::string& to) {
    if (files_.count(to)) return IOError("rename to '" + to + "': is a file");
    if (dirs_.count(to) && !ChildrenLocked(to).empty()) {
      return IOError("rename to '" + to + "': directory not empty");
    }
    MovePrefix(&files_, from, to);
    MovePrefix(&dirs_, from, to);
    return Status::Ok();
  }
  bool ParentExistsLocked(const std::string& p) const {
    const std::string parent = Dirname(p);
    return parent == "." || parent == "/" || dirs_.count(parent) > 0;
  }
  std::vector<std::string> ChildrenLocked(const std::string& dir) const {
    std::set<std::string> names;
    const std::string prefix = dir + "/";
    auto collect = [&](const std::string& p) {
      if (p.compare(0, prefix.size(), prefix) != 0) return;
      std::string rest = p.substr(prefix.size());
      if (rest.find('/') == std::string::npos) names.insert(rest);
    };
    for (const auto& [p, f] : files_) collect(p);
    for (const std::string& d : dirs_) collect(d);
    return {names.begin(), names.end()};
  }

  std::mutex mu_;
  std::map<std::string, std::shared_ptr<MemFile>> files_;
  std::set<std::string> dirs_;
};

}  // namespace

std::unique_ptr<Env> NewMemEnv() { return std::make_unique<MemEnvImpl>(); }

// ---------------------------------------------------------------------------
// FaultInjectionEnv

class FaultWritableFile : public WritableFile {
 public:
  FaultWritableFile(FaultInjectionEnv* env, std::string path, std::unique_ptr<WritableFile> base,
                    uint64_t size = 0)
      : env_(env), path_(std::move(path)), base_(std::move(base)), size_(size) {}
  Status Append(const void* data, size_t size) override {
    RETURN_IF_ERROR(env_->BeforeWrite().Annotate("write '" + path_ + "'"));
    RETURN_IF_ERROR(base_->Append(data, size));
    std::lock_guard<std::mutex> lock(mu_);
    size_ += size;
    return Status::Ok();
  }
  Status WriteAt(uint64_t offset, const void* data, size_t size) override {
    RETURN_IF_ERROR(env_->BeforeWrite().Annotate("write '" + path_ + "'"));
    RETURN_IF_ERROR(base_->WriteAt(offset, data, size));
    std::lock_guard<std::mutex> lock(mu_);
    size_ = std::max<uint64_t>(size_, offset + size);
    return Status::Ok();
  }
  Status Preallocate(uint64_t size) override {
    RETURN_IF_ERROR(env_->BeforeWrite().Annotate("write '" + path_ + "'"));
    RETURN_IF_ERROR(base_->Preallocate(size));
    std::lock_guard<std::mutex> lock(mu_);
    size_ = std::max<uint64_t>(size_, size);
    return Status::Ok();
  }
  void StartWriteback() override { base_->StartWriteback(); }
  Status Sync() override {
    RETURN_IF_ERROR(base_->Sync());
    std::lock_guard<std::mutex> lock(mu_);
    env_->OnSynced(path_, size_);
    return Status::Ok();
  }
  Status Close() override { return base_->Close(); }

 private:
  FaultInjectionEnv* env_;
  std::string path_;
  std::unique_ptr<WritableFile> base_;
  std::mutex mu_;
  uint64_t size_ = 0;
};

void FaultInjectionEnv::FailNthWrite(int64_t n, bool sticky) {
  std::lock_guard<std::mutex> lock(mu_);
  fail_at_ = n == 0 ? 0 : writes_ + n;
  sticky_ = sticky;
}

int64_t FaultInjectionEnv::writes_seen() const {
  std::lock_guard<std::mutex> lock(mu_);
  return writes_;
}

Status FaultInjectionEnv::BeforeWrite() {
  std::lock_guard<std::mutex> lock(mu_);
  ++writes_;
  if (fail_at_ != 0 && (writes_ == fail_at_ || (sticky_ && writes_ > fail_at_))) {
    return IOError("injected fault at write #" + std::to_string(writes_));
  }
  return Status::Ok();
}

void FaultInjectionEnv::OnSynced(const std::string& path, uint64_t size) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = synced_size_.find(path);
  if (it != synced_size_.end()) it->second = size;
}

Result<std::unique_ptr<WritableFile>> FaultInjectionEnv::NewWritableFile(const std::string& path) {
  const bool existed = base_->FileExists(path);
  ASSIGN_OR_RETURN(auto file, base_->NewWritableFile(path));
  std::lock_guard<std::mutex> lock(mu_);
  synced_size_[path] = 0;  // truncated: nothing durable yet
  if (!existed) new_files_.insert(path);
  return std::unique_ptr<WritableFile>(new FaultWritableFile(this, path, std::move(file)));
}

Result<std::unique_ptr<WritableFile>> FaultInjectionEnv::OpenWritableFile(const std::string& path) {
  ASSIGN_OR_RETURN(const uint64_t size, base_->GetFileSize(path));
  ASSIGN_OR_RETURN(auto file, base_->OpenWritableFile(path));
  // What was durable stays so; a Sync here makes everything up to the
  // larger of the file's size and this handle's writes durable.
  return std::unique_ptr<WritableFile>(new FaultWritableFile(this, path, std::move(file), size));
}

Status FaultInjectionEnv::RenameFile(const std::string& from, const std::string& to) {
  PendingRename r{from, to, false, {}};
  if (base_->FileExists(to)) {
    auto old = ReadFileToString(base_, to);
    if (old.ok()) {
      r.had_old_to = true;
      r.old_to_contents = std::move(old).value();
    }
  }
  RETURN_IF_ERROR(base_->RenameFile(from, to));
  std::lock_guard<std::mutex> lock(mu_);
  MoveTrackedLocked(from, to);
  pending_renames_.push_back(std::move(r));
  return Status::Ok();
}

// What is tracked about a file, or every file of a directory, follows it
// through a rename.
void FaultInjectionEnv::MoveTrackedLocked(const std::string& from, const std::string& to) {
  MovePrefix(&synced_size_, from, to);
  MovePrefix(&new_files_, from, to);
}

Status FaultInjectionEnv::DeleteFile(const std::string& path) {
  RETURN_IF_ERROR(base_->DeleteFile(path));
  std::lock_guard<std::mutex> lock(mu_);
  synced_size_.erase(path);
  new_files_.erase(path);
  return Status::Ok();
}

Status FaultInjectionEnv::SyncDir(const std::string& dir) {
  RETURN_IF_ERROR(base_->SyncDir(dir));
  std::lock_guard<std::mutex> lock(mu_);
  const std::string d = Dirname(JoinPath(dir, "x"));  // `dir` without a trailing '/'
  for (auto it = new_files_.begin(); it != new_files_.end();) {
    it = Dirname(*it) == d ? new_files_.erase(it) : std::next(it);
  }
  pending_renames_.erase(std::remove_if(pending_renames_.begin(), pending_renames_.end(),
                                        [&](const PendingRename& r) { return Dirname(r.to) == d; }),
                         pending_renames_.end());
  return Status::Ok();
}

Status FaultInjectionEnv::SimulateCrash() {
  std::lock_guard<std::mutex> lock(mu_);
  // Undo renames that were never made durable, newest first.
  for (auto it = pending_renames_.rbegin(); it != pending_renames_.rend(); ++it) {
    if (base_->FileExists(it->to)) {
      RETURN_IF_ERROR(base_->RenameFile(it->to, it->from));
      MoveTrackedLocked(it->to, it->from);
    }
    if (it->had_old_to) {
      ASSIGN_OR_RETURN(auto f, base_->NewWritableFile(it->to));
      RETURN_IF_ERROR(f->Append(it->old_to_contents.data(), it->old_to_contents.size()));
      RETURN_IF_ERROR(f->Close());
    }
  }
  pending_renames_.clear();
  // Files whose directory entry never became durable disappear.
  for (const std::string& path : new_files_) {
    if (base_->FileExists(path)) RETURN_IF_ERROR(base_->DeleteFile(path));
    synced_size_.erase(path);
  }
  new_files_.clear();
  // Data appended after the last Sync() is lost.
  for (const auto& [path, size] : synced_size_) {
    if (!base_->FileExists(path)) continue;
    ASSIGN_OR_RETURN(uint64_t now, base_->GetFileSize(path));
    if (now <= size) continue;
    std::string keep(size, '\0');
    {
      ASSIGN_OR_RETURN(auto r, base_->NewRandomAccessFile(path));
      RETURN_IF_ERROR(r->Read(0, size, keep.data()));
    }
    ASSIGN_OR_RETURN(auto w, base_->NewWritableFile(path));
    RETURN_IF_ERROR(w->Append(keep.data(), keep.size()));
    RETURN_IF_ERROR(w->Close());
  }
  return Status::Ok();
}

}  // namespace tessera
