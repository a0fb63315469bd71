//! The CNI node agent's half of ZDS, the conversation istio-cni holds with ztunnel over a
//! Unix socket (istio/ztunnel `proto/zds.proto`): the agent listens on a `SOCK_SEQPACKET`
//! socket (ztunnel's `INPOD_UDS`), ztunnel connects and says hello, and the agent sends one
//! `AddWorkload` per pod on the node, each with the pod's network namespace as an
//! `SCM_RIGHTS` fd, then `SnapshotSent`; later `AddWorkload` and `DelWorkload` as pods come
//! and go. ztunnel acknowledges each request (an `Ack` whose `error` is empty on success).
//! One protobuf message per packet. A ztunnel that connects again (restarted) gets the
//! whole snapshot again.
//!
//! The messages are written here as prost types: ZDS's wire shape, field numbers included.

use std::collections::BTreeMap;
use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use prost::Message;
use uds::{UnixSeqpacketConn, UnixSeqpacketListener};

/// How long the agent waits for ztunnel's answer to one request.
const ACK_TIMEOUT: Duration = Duration::from_secs(15);

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
#[repr(i32)]
pub enum Version {
    NotUsed = 0,
    V1 = 1,
}

/// ztunnel's first message.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ZdsHello {
    #[prost(enumeration = "Version", tag = "1")]
    pub version: i32,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct WorkloadInfo {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(string, tag = "2")]
    pub namespace: String,
    #[prost(string, tag = "3")]
    pub service_account: String,
}

/// A pod to proxy: its Kubernetes uid, and who it is. Its netns goes beside it.
#[derive(Clone, PartialEq, prost::Message)]
pub struct AddWorkload {
    #[prost(string, tag = "1")]
    pub uid: String,
    #[prost(message, optional, tag = "2")]
    pub workload_info: Option<WorkloadInfo>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct DelWorkload {
    #[prost(string, tag = "2")]
    pub uid: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct SnapshotSent {}

#[derive(Clone, PartialEq, prost::Oneof)]
pub enum Payload {
    #[prost(message, tag = "1")]
    Add(AddWorkload),
    #[prost(message, tag = "2")]
    Del(DelWorkload),
    #[prost(message, tag = "3")]
    SnapshotSent(SnapshotSent),
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct WorkloadRequest {
    #[prost(oneof = "Payload", tags = "1, 2, 3")]
    pub payload: Option<Payload>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Ack {
    #[prost(string, tag = "1")]
    pub error: String,
}

#[derive(Clone, PartialEq, prost::Oneof)]
pub enum ResponsePayload {
    #[prost(message, tag = "1")]
    Ack(Ack),
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct WorkloadResponse {
    #[prost(oneof = "ResponsePayload", tags = "1")]
    pub payload: Option<ResponsePayload>,
}

/// A pod the agent has told ztunnel about.
#[derive(Debug)]
struct Enrolled {
    info: WorkloadInfo,
    netns: File,
}

#[derive(Debug, Default)]
struct Shared {
    pods: BTreeMap<String, Enrolled>,
    /// The connected ztunnel, once it has had its snapshot.
    ztunnel: Option<UnixSeqpacketConn>,
}

/// One node's agent: the listening socket and what it has enrolled.
#[derive(Debug)]
pub struct Agent {
    path: PathBuf,
    stop: Arc<AtomicBool>,
    shared: Arc<Mutex<Shared>>,
}

impl Agent {
    /// Listens on `path` (ztunnel's `INPOD_UDS`) and serves each ztunnel that connects.
    pub fn listen(path: &Path) -> Agent {
        let _ = std::fs::remove_file(path);
        let listener = UnixSeqpacketListener::bind(path)
            .unwrap_or_else(|e| panic!("bind the ZDS socket {}: {e}", path.display()));
        listener.set_nonblocking(true).expect("nonblocking");
        let shared = Arc::new(Mutex::new(Shared::default()));
        let stop = Arc::new(AtomicBool::new(false));
        let (state, stopped) = (shared.clone(), stop.clone());
        std::thread::Builder::new()
            .name("zds-agent".into())
            .spawn(move || {
                while !stopped.load(Ordering::Relaxed) {
                    let Ok((conn, _)) = listener.accept_unix_addr() else {
                        std::thread::sleep(Duration::from_millis(10));
                        continue;
                    };
                    let mut shared = state.lock().expect("zds state");
                    match handshake(conn, &shared.pods) {
                        Ok(conn) => {
                            shared.ztunnel = Some(conn);
                        }
                        Err(e) => eprintln!("ZDS session failed: {e}"),
                    }
                }
            })
            .expect("spawn the ZDS agent");
        Agent {
            path: path.to_path_buf(),
            stop,
            shared,
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Enrolls a pod (its uid is the Kubernetes `metadata.uid`), telling a connected ztunnel
    /// now; fails the test if ztunnel refuses it.
    pub fn add(&self, uid: &str, info: WorkloadInfo, netns: File) {
        let mut shared = self.shared.lock().expect("zds state");
        if let Some(conn) = shared.ztunnel.as_ref() {
            let request = add_request(uid, &info);
            if let Err(e) = send(conn, &request, Some(&netns)).and_then(|()| ack(conn)) {
                panic!("ztunnel refused AddWorkload {uid}: {e}");
            }
        }
        shared
            .pods
            .insert(uid.to_string(), Enrolled { info, netns });
    }

    /// Removes a pod (as the agent does when its sandbox goes away).
    pub fn delete(&self, uid: &str) {
        let mut shared = self.shared.lock().expect("zds state");
        shared.pods.remove(uid);
        if let Some(conn) = shared.ztunnel.as_ref() {
            let request = WorkloadRequest {
                payload: Some(Payload::Del(DelWorkload { uid: uid.into() })),
            };
            if let Err(e) = send(conn, &request, None).and_then(|()| ack(conn)) {
                panic!("ztunnel refused DelWorkload {uid}: {e}");
            }
        }
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        let _ = std::fs::remove_file(&self.path);
    }
}

fn add_request(uid: &str, info: &WorkloadInfo) -> WorkloadRequest {
    WorkloadRequest {
        payload: Some(Payload::Add(AddWorkload {
            uid: uid.into(),
            workload_info: Some(info.clone()),
        })),
    }
}

/// Reads ztunnel's hello, sends the snapshot, and returns the connection ready for updates.
fn handshake(
    conn: UnixSeqpacketConn,
    pods: &BTreeMap<String, Enrolled>,
) -> std::io::Result<UnixSeqpacketConn> {
    conn.set_nonblocking(false)?;
    conn.set_read_timeout(Some(ACK_TIMEOUT))?;
    let hello = ZdsHello::decode(read_packet(&conn)?.as_slice())
        .map_err(|e| std::io::Error::other(format!("bad ZdsHello: {e}")))?;
    if hello.version != Version::V1 as i32 {
        return Err(std::io::Error::other(format!(
            "ztunnel speaks ZDS version {}, not V1",
            hello.version
        )));
    }
    for (uid, pod) in pods {
        send(&conn, &add_request(uid, &pod.info), Some(&pod.netns))?;
        ack(&conn)?;
    }
    let snapshot = WorkloadRequest {
        payload: Some(Payload::SnapshotSent(SnapshotSent {})),
    };
    send(&conn, &snapshot, None)?;
    ack(&conn)?;
    Ok(conn)
}

fn read_packet(conn: &UnixSeqpacketConn) -> std::io::Result<Vec<u8>> {
    let mut buffer = vec![0; 64 * 1024];
    let n = conn.recv(&mut buffer)?;
    if n == 0 {
        return Err(std::io::ErrorKind::UnexpectedEof.into());
    }
    buffer.truncate(n);
    Ok(buffer)
}

/// Sends one request, with `netns` as SCM_RIGHTS when given.
fn send(
    conn: &UnixSeqpacketConn,
    request: &WorkloadRequest,
    netns: Option<&File>,
) -> std::io::Result<()> {
    let bytes = request.encode_to_vec();
    match netns {
        Some(file) => conn.send_fds(&bytes, &[file.as_raw_fd()])?,
        None => conn.send(&bytes)?,
    };
    Ok(())
}

/// Reads ztunnel's answer; an error when it is not an empty Ack.
fn ack(conn: &UnixSeqpacketConn) -> std::io::Result<()> {
    let response = WorkloadResponse::decode(read_packet(conn)?.as_slice())
        .map_err(|e| std::io::Error::other(format!("bad WorkloadResponse: {e}")))?;
    match response.payload {
        Some(ResponsePayload::Ack(Ack { error })) if error.is_empty() => Ok(()),
        Some(ResponsePayload::Ack(Ack { error })) => Err(std::io::Error::other(error)),
        None => Err(std::io::Error::other("a WorkloadResponse without an Ack")),
    }
}
