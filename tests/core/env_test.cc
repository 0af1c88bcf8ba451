#include "core/env.h"

#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdlib>
#include <memory>

namespace tessera {
namespace {

// A fresh directory under $TMPDIR for POSIX tests, removed afterwards.
class TempDir {
 public:
  TempDir() {
    std::string tmpl =
        std::string(std::getenv("TMPDIR") ? std::getenv("TMPDIR") : "/tmp") + "/tessera_env_XXXXXX";
    path_ = ::mkdtemp(tmpl.data()) ? tmpl : "";
  }
  ~TempDir() { (void)DeleteRecursively(Env::Default(), path_); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

Status WriteAll(Env* env, const std::string& path, const std::string& data, bool sync) {
  ASSIGN_OR_RETURN(auto f, env->NewWritableFile(path));
  RETURN_IF_ERROR(f->Append(data.data(), data.size()));
  if (sync) RETURN_IF_ERROR(f->Sync());
  return f->Close();
}

void ExerciseEnv(Env* env, const std::string& root) {
  const std::string dir = JoinPath(root, "a/b");
  REQUIRE(env->CreateDirs(dir).ok());
  CHECK(env->IsDirectory(dir));
  const std::string f = JoinPath(dir, "data.bin");
  REQUIRE(WriteAll(env, f, "hello world", true).ok());
  CHECK(env->FileExists(f));
  CHECK(*env->GetFileSize(f) == 11);

  auto r = env->NewRandomAccessFile(f);
  REQUIRE(r.ok());
  char buf[5];
  REQUIRE((*r)->Read(6, 5, buf).ok());
  CHECK(std::string(buf, 5) == "world");
  Status past_end = (*r)->Read(8, 5, buf);
  CHECK(past_end.code() == StatusCode::kDataLoss);
  CHECK(past_end.message().find(f) != std::string::npos);

  REQUIRE(WriteFileAtomically(env, JoinPath(dir, "latest"), "step-1").ok());
  REQUIRE(WriteFileAtomically(env, JoinPath(dir, "latest"), "step-2").ok());
  CHECK(*ReadFileToString(env, JoinPath(dir, "latest")) == "step-2");
  CHECK_FALSE(env->FileExists(JoinPath(dir, "latest.tmp")));

  auto children = env->GetChildren(dir);
  REQUIRE(children.ok());
  CHECK(*children == std::vector<std::string>{"data.bin", "latest"});
  CHECK(env->RenameFile(f, JoinPath(dir, "moved.bin")).ok());
  CHECK_FALSE(env->FileExists(f));
  auto missing = env->NewRandomAccessFile(f);
  REQUIRE_FALSE(missing.ok());
  CHECK(missing.status().code() == StatusCode::kNotFound);
  CHECK(missing.status().message().find("data.bin") != std::string::npos);

  // A file several writers fill at planned offsets: one creates and
  // preallocates it, another opens it without truncating.
  const std::string shared = JoinPath(dir, "shared.bin");
  CHECK(env->OpenWritableFile(shared).status().code() == StatusCode::kNotFound);
  auto first = env->NewWritableFile(shared);
  REQUIRE(first.ok());
  REQUIRE((*first)->Preallocate(10).ok());
  REQUIRE((*first)->WriteAt(0, "ab", 2).ok());
  auto second = env->OpenWritableFile(shared);
  REQUIRE(second.ok());
  REQUIRE((*second)->WriteAt(6, "cd", 2).ok());
  REQUIRE((*second)->Sync().ok());
  REQUIRE((*first)->Close().ok());
  REQUIRE((*second)->Close().ok());
  CHECK(*ReadFileToString(env, shared) == std::string("ab\0\0\0\0cd\0\0", 10));

  REQUIRE(DeleteRecursively(env, JoinPath(root, "a")).ok());
  CHECK_FALSE(env->FileExists(dir));
}

TEST_CASE("PosixEnv and MemEnv behave alike") {
  TempDir tmp;
  REQUIRE_FALSE(tmp.path().empty());
  SECTION("posix") { ExerciseEnv(Env::Default(), tmp.path()); }
  SECTION("memory") {
    auto mem = NewMemEnv();
    ExerciseEnv(mem.get(), "/root");
  }
}

TEST_CASE("PosixEnv lends a file's bytes through a mapping, MemEnv reads them") {
  TempDir tmp;
  REQUIRE_FALSE(tmp.path().empty());
  std::string data(3 * 4096 + 100, 0);
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<char>(i * 7 + 3);
  const std::string f = JoinPath(tmp.path(), "data.bin");
  REQUIRE(WriteAll(Env::Default(), f, data, true).ok());
  auto r = Env::Default()->NewRandomAccessFile(f);
  REQUIRE(r.ok());
  for (auto [offset, size] :
       {std::pair<uint64_t, size_t>{0, data.size()}, {4095, 2}, {5000, 7388}}) {
    auto view = (*r)->View(offset, size);
    REQUIRE(view.ok());
    REQUIRE(*view != nullptr);
    REQUIRE((*view)->size() == size);
    CHECK(std::string((*view)->data(), size) == data.substr(offset, size));
    SubView part(std::move(*view), 1, size - 1);  // keeps the mapping alive
    CHECK(std::string(part.data(), part.size()) == data.substr(offset + 1, size - 1));
  }
  auto past = (*r)->View(data.size() - 10, 11);
  REQUIRE_FALSE(past.ok());
  CHECK(past.status().code() == StatusCode::kDataLoss);
  CHECK(past.status().message().find(f) != std::string::npos);
  auto mem = NewMemEnv();
  REQUIRE(WriteAll(mem.get(), "/data.bin", data, true).ok());
  auto m = mem->NewRandomAccessFile("/data.bin");
  REQUIRE(m.ok());
  auto none = (*m)->View(0, 10);
  REQUIRE(none.ok());
  CHECK(*none == nullptr);
}

TEST_CASE("FaultInjectionEnv drops unsynced data and undurable files on a crash") {
  auto mem = NewMemEnv();
  FaultInjectionEnv env(mem.get());
  REQUIRE(env.CreateDirs("/ck").ok());
  REQUIRE(env.SyncDir("/").ok());

  // Synced data and a synced directory entry survive.
  REQUIRE(WriteAll(&env, "/ck/synced", "durable", true).ok());
  REQUIRE(env.SyncDir("/ck").ok());
  // Appended after the sync: lost.
  {
    auto f = env.NewWritableFile("/ck/partial");
    REQUIRE(f.ok());
    REQUIRE((*f)->Append("abc", 3).ok());
    REQUIRE((*f)->Sync().ok());
    REQUIRE((*f)->Append("def", 3).ok());
  }
  REQUIRE(env.SyncDir("/ck").ok());
  // Never synced, directory never synced: the file disappears.
  REQUIRE(WriteAll(&env, "/ck/ghost", "boo", false).ok());

  REQUIRE(env.SimulateCrash().ok());
  CHECK(*ReadFileToString(&env, "/ck/synced") == "durable");
  CHECK(*ReadFileToString(&env, "/ck/partial") == "abc");
  CHECK_FALSE(env.FileExists("/ck/ghost"));
}

TEST_CASE("FaultInjectionEnv: a rename without a directory sync is undone") {
  auto mem = NewMemEnv();
  FaultInjectionEnv env(mem.get());
  REQUIRE(env.CreateDirs("/ck").ok());
  REQUIRE(WriteFileAtomically(&env, "/ck/latest", "old").ok());
  // The second commit's rename happens, but the crash comes before SyncDir.
  REQUIRE(WriteAll(&env, "/ck/latest.tmp", "new", true).ok());
  REQUIRE(env.RenameFile("/ck/latest.tmp", "/ck/latest").ok());
  CHECK(*ReadFileToString(&env, "/ck/latest") == "new");
  REQUIRE(env.SimulateCrash().ok());
  CHECK(*ReadFileToString(&env, "/ck/latest") == "old");
}

TEST_CASE("FaultInjectionEnv fails the Nth write, once or from then on") {
  auto mem = NewMemEnv();
  FaultInjectionEnv env(mem.get());
  auto f = env.NewWritableFile("/f");
  REQUIRE(f.ok());
  env.FailNthWrite(2);
  CHECK((*f)->Append("1", 1).ok());
  Status s = (*f)->Append("2", 1);
  CHECK(s.code() == StatusCode::kIOError);
  CHECK(s.message().find("/f") != std::string::npos);
  CHECK((*f)->Append("3", 1).ok());
  env.FailNthWrite(1, /*sticky=*/true);
  CHECK_FALSE((*f)->Append("4", 1).ok());
  CHECK_FALSE((*f)->Append("5", 1).ok());
  env.FailNthWrite(0);
  CHECK((*f)->Append("6", 1).ok());
  CHECK(*ReadFileToString(&env, "/f") == "136");
  // WriteFileAtomically under a failing disk leaves the old file intact.
  REQUIRE(WriteFileAtomically(&env, "/latest", "v1").ok());
  env.FailNthWrite(1);
  CHECK_FALSE(WriteFileAtomically(&env, "/latest", "v2").ok());
  CHECK(*ReadFileToString(&env, "/latest") == "v1");
}

}  // namespace
}  // namespace tessera
