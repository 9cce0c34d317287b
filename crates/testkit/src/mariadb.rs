use std::ffi::OsString;
use std::io;
use std::path::Path;
use std::process::{Child, Command};
use std::time::Duration;

use sqlx::{Connection, MySqlConnection};

use crate::process::{self, private_server, NotReady, Startup};

/// How `mariadbd` starts, as a private server or a Galera node. The 60 s bound is on
/// every start of mariadbd, InnoDB's crash recovery included (the slow part on a
/// machine busy compiling; a second or less here otherwise): a private server's until
/// root can log in (after [`kill9`](crate::PrivateServer::kill9) too), fresh Galera
/// nodes' until they have formed their cluster (the template's one alone, or three at
/// once), and `mariadbd --wsrep-recover`'s run. One probe (a full login as root, a statement or
/// two) is bounded by 2 s: a healthy server answers in a few milliseconds, a paused one
/// never.
pub(crate) const MARIADBD: Startup = Startup {
    what: "mariadbd",
    log: "mariadbd.log",
    timeout: Duration::from_secs(60),
    probe_timeout: Duration::from_secs(2),
};

/// Longest wait for `mariadb-install-db` to create the system tables. It
/// takes about a second here; the bound is for a busy machine.
const INSTALL_TIMEOUT: Duration = Duration::from_secs(120);

/// Redo log size for the private server. The default (96 MiB) makes every
/// instance cost ~115 MB of disk and longer to create; 8 MiB keeps it ~25 MB.
/// Passed to both install and server so the two agree.
pub(crate) const INNODB_LOG_FILE_SIZE: &str = "--innodb-log-file-size=8M";

/// Buffer pool of the private server: small, tests hold little data and
/// several instances may run at once.
pub(crate) const INNODB_BUFFER_POOL_SIZE: &str = "--innodb-buffer-pool-size=64M";

/// Subdirectory of the temp dir holding the data files.
pub(crate) const DATA_DIR: &str = "data";
/// Subdirectory of the temp dir used as the server's `--tmpdir`.
///
/// Must not be the default `/tmp`: at startup (install included) mariadbd
/// deletes every `#sql*` file in its tmpdir as a leftover of a crash, so a
/// server starting with `/tmp` deletes the live temporary tables of every
/// other server using `/tmp`, including the shared one on 3306. Seen here as
/// parallel `mariadb-install-db` runs failing with
/// `Unknown table 'mysql.tmp_user_sys'`.
pub(crate) const TMP_DIR: &str = "tmp";
/// Log of `mariadb-install-db` inside the temp dir.
const INSTALL_LOG: &str = "install.log";

private_server! {
    /// A `mariadbd` of the test's own, on a free port of 127.0.0.1, with its own
    /// data directory; root logs in over TCP with an empty password. Its URL
    /// (`mysql://root@127.0.0.1:N`), address, kill9 and restart are
    /// [`PrivateServer`](crate::PrivateServer)'s: a restart waits for InnoDB's crash
    /// recovery, and finds whatever was committed before the crash.
    ///
    /// Why: crash and stall tests must kill -9, restart or pause (SIGSTOP) the
    /// database, which must never happen to the shared MariaDB on 3306. The data
    /// directory survives [`kill9`](crate::PrivateServer::kill9) and
    /// [`restart`](crate::PrivateServer::restart), so tests can check what InnoDB kept.
    /// Dropping this value kills the server and deletes the data directory.
    ///
    /// The server runs with `--no-defaults`: this machine's `/etc/mysql/my.cnf`
    /// sets `user=mysql`, `pid-file=/run/mysqld/mysqld.pid` and a shared
    /// `log-error`, which would make the private server fail, or clobber the
    /// shared server's pid file and log.
    PrivateMariadb(MARIADBD, "mysql://root@127.0.0.1:{}", launch)
}

impl PrivateMariadb {
    /// Creates a fresh data directory with `mariadb-install-db` (about a
    /// second), starts `mariadbd` on a free port and waits (bounded) until
    /// root can log in.
    ///
    /// Why: a test gets a server that is ready for use when this returns,
    /// with the same character set as the shared server, and the `test`
    /// database like there.
    pub async fn start() -> io::Result<PrivateMariadb> {
        let dir = tempfile::Builder::new().prefix("fs-mariadb-").tempdir()?;
        std::fs::create_dir(dir.path().join(TMP_DIR))?;
        install(dir.path()).await?;
        Self::start_in(dir).await
    }

    /// Pauses the server with SIGSTOP: connections stay open but nothing
    /// answers.
    ///
    /// Why: timeout tests need a database that hangs rather than fails.
    /// Call [`sigcont`](Self::sigcont) to resume; dropping a paused server
    /// is fine (SIGKILL works on stopped processes).
    pub fn sigstop(&self) -> io::Result<()> {
        let pid = self.pid()?;
        process::send_signal(pid, libc::SIGSTOP)?;
        process::wait_stopped(pid)
    }

    /// Resumes a server paused by [`sigstop`](Self::sigstop).
    ///
    /// Why: tests check that the service recovers once the database
    /// answers again.
    pub fn sigcont(&self) -> io::Result<()> {
        process::send_signal(self.pid()?, libc::SIGCONT)
    }

    /// The running server's pid, or an error if it was killed.
    fn pid(&self) -> io::Result<u32> {
        self.server.child.as_ref().map(Child::id).ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::NotFound,
                "private mariadbd is not running (killed and not restarted)",
            )
        })
    }
}

/// `--name=<path>` as one argument, without assuming the path is UTF-8.
pub(crate) fn path_arg(name: &str, path: &Path) -> OsString {
    let mut arg = OsString::from(name);
    arg.push(path);
    arg
}

/// Runs `mariadb-install-db` into `dir/data`, bounded by [`INSTALL_TIMEOUT`].
pub(crate) async fn install(dir: &Path) -> io::Result<()> {
    let log = dir.join(INSTALL_LOG);
    let mut cmd = tokio::process::Command::new("mariadb-install-db");
    // --no-defaults must come first; see PrivateMariadb's docs for why.
    cmd.arg("--no-defaults")
        .arg(path_arg("--datadir=", &dir.join(DATA_DIR)))
        .arg(path_arg("--tmpdir=", &dir.join(TMP_DIR)))
        .arg("--auth-root-authentication-method=normal")
        .arg(INNODB_LOG_FILE_SIZE);
    if process::running_as_root() {
        cmd.arg("--user=root");
    }
    // Own process group: on timeout, the bootstrap mariadbd it forked is
    // killed along with the script.
    cmd.process_group(0).kill_on_drop(true);
    process::run_bounded(&mut cmd, &log, INSTALL_TIMEOUT, "mariadb-install-db").await
}

/// Spawns mariadbd on `port` with its files in `dir` and waits until root
/// can log in.
async fn launch(dir: &Path, port: u16) -> Result<Child, NotReady> {
    let mut cmd = Command::new("mariadbd");
    // --no-defaults must come first; see PrivateMariadb's docs for why.
    cmd.arg("--no-defaults")
        .arg(path_arg("--datadir=", &dir.join(DATA_DIR)))
        .arg(path_arg("--tmpdir=", &dir.join(TMP_DIR)))
        .arg(format!("--port={port}"))
        .arg(path_arg("--socket=", &dir.join("sock")))
        .arg(path_arg("--pid-file=", &dir.join("mariadbd.pid")))
        .arg("--bind-address=127.0.0.1")
        .arg("--skip-name-resolve")
        .arg("--character-set-server=utf8mb4")
        .arg("--collation-server=utf8mb4_general_ci")
        .arg(INNODB_LOG_FILE_SIZE)
        .arg(INNODB_BUFFER_POOL_SIZE);
    if process::running_as_root() {
        cmd.arg("--user=root");
    }
    let mut child = MARIADBD.spawn(&mut cmd, dir)?;
    let url = format!("mysql://root@127.0.0.1:{port}");
    let socket = dir.join("sock").to_string_lossy().into_owned();
    MARIADBD
        .wait_ready(&mut child, dir, || accepts_login(&url, &socket))
        .await?;
    Ok(child)
}

/// True if root can log in at `url` to the server whose socket is `socket` (and the
/// connection closes cleanly). The socket tells servers apart: mariadbd binds its port
/// only after starting InnoDB, about a second, so another test's server that took the
/// same free port meanwhile would answer there first; ours then fails to bind and exits,
/// and [`PrivateMariadb::start`] tries another port.
async fn accepts_login(url: &str, socket: &str) -> bool {
    let attempt = async {
        let mut conn = MySqlConnection::connect(url).await?;
        let theirs: String = sqlx::query_scalar("SELECT CAST(@@socket AS CHAR)")
            .fetch_one(&mut conn)
            .await?;
        conn.close().await?;
        Ok::<_, sqlx::Error>(theirs == socket)
    };
    MARIADBD.probe(attempt).await
}

#[cfg(test)]
mod tests {
    use super::*;

    // Checks that the readiness probe tells servers apart: a second mariadbd launched on
    // the port a private server already serves must be reported as not started (it
    // can't bind), not as ready because the first one answers there. How: start A,
    // install B's files, launch B on A's port, expect `NotReady::Exited`; A still
    // answers afterwards.
    #[tokio::test]
    async fn a_port_another_server_answers_on_is_not_ours() {
        let a = PrivateMariadb::start().await.expect("first server");
        let b_dir = tempfile::Builder::new()
            .prefix("fs-mariadb-")
            .tempdir()
            .expect("temp dir");
        std::fs::create_dir(b_dir.path().join(TMP_DIR)).expect("tmp dir");
        install(b_dir.path()).await.expect("install the second");
        match launch(b_dir.path(), a.port).await {
            Err(NotReady::Exited(_)) => {}
            Err(NotReady::Failed(e)) => panic!("expected an exit, got {e}"),
            Ok(mut child) => {
                let _ = child.kill();
                panic!("the second server was taken for ready on the first one's port");
            }
        }
        assert!(accepts_login(&a.url(), &a.dir.path().join("sock").to_string_lossy()).await);
    }
}
