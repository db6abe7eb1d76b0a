//! The server's side of joining: the connections that proved the key,
//! grouped by session until all of a session's are in.

use std::io::Write;
use std::net::{Shutdown, TcpStream};
use std::time::{Duration, Instant};

use ferry_channel::{Join, Session};

use super::{Conn, START};

/// Connections held in sessions not yet complete, over all of them; past
/// this the oldest incomplete session is dropped (a client that holds the
/// key but never completes its sessions cannot pile up sockets).
pub const MAX_HELD: usize = 64;

/// How a connection's joining went.
pub enum Joined {
    /// Its session waits for more connections.
    Waiting,
    /// It completed its session: connection 0's session keys and the
    /// connections in order.
    Complete(Session, Conn),
    /// It does not fit its session (another count, an index already
    /// taken); it has been closed.
    Refused(String),
}

struct Group {
    token: [u8; 16],
    count: u8,
    since: Instant,
    session: Option<Session>,
    socks: Vec<Option<TcpStream>>,
}

impl Group {
    fn close(&self) {
        for s in self.socks.iter().flatten() {
            let _ = s.shutdown(Shutdown::Both);
        }
    }
    fn held(&self) -> usize {
        self.socks.iter().flatten().count()
    }
}

/// Sessions whose connections are coming in.
pub struct Groups {
    groups: Vec<Group>,
    /// How long a session may take to gather its connections.
    wait: Duration,
}

impl Groups {
    pub fn new(wait: Duration) -> Self {
        Groups {
            groups: Vec::new(),
            wait,
        }
    }

    /// Connection `join.index` of session `join.token` proved the key
    /// (its handshake gave `session`).
    pub fn add(&mut self, join: Join, session: Session, s: TcpStream) -> Joined {
        self.expire();
        let k = match self.groups.iter().position(|g| g.token == join.token) {
            Some(k) => k,
            None => {
                self.groups.push(Group {
                    token: join.token,
                    count: join.count,
                    since: Instant::now(),
                    session: None,
                    socks: (0..join.count).map(|_| None).collect(),
                });
                self.groups.len() - 1
            }
        };
        let g = &mut self.groups[k];
        let i = usize::from(join.index);
        let refuse = |why: String| {
            let _ = s.shutdown(Shutdown::Both);
            Joined::Refused(why)
        };
        if g.count != join.count {
            return refuse(format!(
                "a connection for {} connections joined a session of {}",
                join.count, g.count
            ));
        }
        if g.socks[i].is_some() {
            return refuse(format!("connection {i} of a session came twice"));
        }
        if i == 0 {
            g.session = Some(session);
        }
        g.socks[i] = Some(s);
        if g.socks.iter().all(Option::is_some) {
            let g = self.groups.remove(k);
            // The start: the client sends nothing before it has this on
            // every connection, so it never talks into a session that a
            // lost connection left incomplete.
            let started = g
                .socks
                .iter()
                .flatten()
                .all(|mut s| s.write_all(&[START]).is_ok());
            let socks: Vec<TcpStream> = g.socks.into_iter().flatten().collect();
            match (g.session, started) {
                (Some(session), true) => match Conn::striped(socks) {
                    Ok(conn) => return Joined::Complete(session, conn),
                    Err(e) => return Joined::Refused(format!("a striped session: {e}")),
                },
                _ => {
                    for s in &socks {
                        let _ = s.shutdown(Shutdown::Both);
                    }
                    return Joined::Refused("a connection of the session is gone".into());
                }
            }
        }
        while self.held() > MAX_HELD {
            self.groups.remove(0).close();
        }
        Joined::Waiting
    }

    /// Connections held in sessions not yet complete.
    pub fn held(&self) -> usize {
        self.groups.iter().map(Group::held).sum()
    }

    /// Drop the sessions that took too long to gather.
    pub fn expire(&mut self) {
        let wait = self.wait;
        self.groups.retain(|g| {
            let keep = g.since.elapsed() <= wait;
            if !keep {
                g.close();
            }
            keep
        });
    }
}
