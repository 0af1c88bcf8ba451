#include "ckpt/output.h"

#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <fstream>
#include <string>

namespace tessera {
namespace {

// Whether process `pid` is running: it exists and is not a zombie (a
// killed process stays one until its parent reaps it, and in containers
// whose first process does not reap, it stays for good).
bool Running(pid_t pid) {
  if (::kill(pid, 0) != 0 && errno == ESRCH) return false;
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!stat || !std::getline(stat, line)) return true;  // no /proc: trust kill
  const size_t paren = line.rfind(')');
  return !(paren != std::string::npos && paren + 2 < line.size() && line[paren + 2] == 'Z');
}

// Temporary outputs `<path>.tmp-<pid>` left by writers that died (killed,
// crashed) are removed; a live writer's are left alone.
void RemoveStaleTemporaries(Env* env, const std::string& path) {
  const std::string dir = Dirname(path);
  const size_t slash = path.rfind('/');
  const std::string prefix = path.substr(slash == std::string::npos ? 0 : slash + 1) + ".tmp-";
  auto children = env->GetChildren(dir);
  if (!children.ok()) return;
  for (const std::string& name : *children) {
    if (name.rfind(prefix, 0) != 0) continue;
    const std::string digits = name.substr(prefix.size());
    if (digits.empty() || digits.size() > 9 ||
        digits.find_first_not_of("0123456789") != std::string::npos) {
      continue;
    }
    const pid_t pid = static_cast<pid_t>(std::stoll(digits));
    if (pid == ::getpid() || Running(pid)) continue;
    const std::string stale = JoinPath(dir, name);
    if (env->IsDirectory(stale)) {
      (void)DeleteRecursively(env, stale);
    } else {
      (void)env->DeleteFile(stale);
    }
  }
}

}  // namespace

Result<OutputPaths> PrepareOutput(Env* env, const std::string& path, bool overwrite,
                                  bool directory) {
  if (path.empty()) return InvalidArgumentError("no output path given");
  OutputPaths out;
  out.path = path;
  while (out.path.size() > 1 && out.path.back() == '/') out.path.pop_back();
  if (env->FileExists(out.path) && !overwrite) {
    return AlreadyExistsError("'" + out.path + "' already exists (pass --overwrite to replace it)");
  }
  RemoveStaleTemporaries(env, out.path);
  out.tmp = out.path + ".tmp-" + std::to_string(::getpid());
  RemoveOutput(env, out);
  if (directory) RETURN_IF_ERROR(env->CreateDirs(out.tmp));
  return out;
}

Status CommitOutput(Env* env, const OutputPaths& out, bool overwrite) {
  std::string replaced;  // an existing output moved aside by --overwrite
  if (env->FileExists(out.path)) {
    if (!overwrite) {
      return AlreadyExistsError("'" + out.path +
                                "' already exists (pass --overwrite to replace it)");
    }
    replaced = out.tmp + "-old";
    RETURN_IF_ERROR(env->RenameFile(out.path, replaced));
  }
  RETURN_IF_ERROR(env->RenameFile(out.tmp, out.path));
  RETURN_IF_ERROR(env->SyncDir(Dirname(out.path)));
  if (replaced.empty()) return Status::Ok();
  return env->IsDirectory(replaced) ? DeleteRecursively(env, replaced) : env->DeleteFile(replaced);
}

void RemoveOutput(Env* env, const OutputPaths& out) {
  if (!env->FileExists(out.tmp)) return;
  if (env->IsDirectory(out.tmp)) {
    (void)DeleteRecursively(env, out.tmp);
  } else {
    (void)env->DeleteFile(out.tmp);
  }
}

}  // namespace tessera
