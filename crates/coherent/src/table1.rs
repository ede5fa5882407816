//! Table 1 of the coherency paper: the application module's IPC rules for one
//! document, with its Read Queue and Update Queue.
//!
//! | IPC | Read Queue | Update Queue | Rule |
//! |---|---|---|---|
//! | READ_REQUEST | Empty | Empty | send READ_PROCEED; enqueue in Read Queue |
//! | READ_REQUEST | Not Empty | Empty | send READ_PROCEED; enqueue in Read Queue |
//! | READ_REQUEST | Empty | Not Empty | enqueue in Update Queue |
//! | READ_REQUEST | Not Empty | Not Empty | enqueue in Update Queue |
//! | READ_DONE | Empty | Not Empty | erroneous |
//! | READ_DONE | Not Empty | Empty | dequeue from Read Queue |
//! | READ_DONE | Not Empty | Not Empty | dequeue; if Read Queue now empty, UPDATE_PROCEED to head of Update Queue |
//! | UPDATE_REQUEST | Empty | Empty | enqueue in Update Queue; send UPDATE_PROCEED |
//! | UPDATE_REQUEST | Empty | Not Empty | erroneous |
//! | UPDATE_REQUEST | Not Empty | Empty | enqueue in Update Queue |
//! | UPDATE_REQUEST | Not Empty | Not Empty | erroneous |
//! | UPDATE_DONE | Empty | Empty | erroneous |
//! | UPDATE_DONE | Empty | Not Empty | dequeue the update; READ_PROCEED to every read in the Update Queue, moving them to the Read Queue |
//! | UPDATE_DONE | Not Empty | Not Empty | erroneous |
//!
//! Two cases the table leaves implicit are errors here too: READ_DONE with
//! both queues empty, and a DONE whose request id is not the one holding
//! access (the paper dequeues "one entry"; we dequeue the named one, so a
//! confused client is caught instead of releasing someone else).
//!
//! The Update Queue, when not empty, holds one update at its head followed
//! only by reads; the update is in progress iff the Read Queue is empty.
//!
//! The table says nothing about versions. When an update's new versions
//! become visible to proxies, at UPDATE_PROCEED (the paper's module) or at
//! UPDATE_DONE after its page is published, is the module's mode:
//! [`crate::update_plan`].

use std::collections::VecDeque;

/// A request's id, unique within the module.
pub type RequestId = u64;

/// An IPC message into the module for one document.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ipc {
    ReadRequest(RequestId),
    ReadDone(RequestId),
    UpdateRequest(RequestId),
    UpdateDone(RequestId),
}

/// A message out of the module.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Proceed {
    Read(RequestId),
    Update(RequestId),
}

/// The "erroneous state" rows, and misuse of request ids.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Table1Error {
    #[error("READ_DONE for request {0}, which is not reading")]
    NotReading(RequestId),
    #[error("UPDATE_REQUEST {0} while another update is queued or in progress")]
    UpdatePending(RequestId),
    #[error("UPDATE_DONE for request {0}, which is not the update in progress")]
    NotUpdating(RequestId),
    #[error("request {0} is already queued on this document")]
    Duplicate(RequestId),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Queued {
    Update(RequestId),
    Read(RequestId),
}

/// The two queues of one document.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DocumentQueues {
    read_queue: VecDeque<RequestId>,
    update_queue: VecDeque<Queued>,
}

impl DocumentQueues {
    pub fn new() -> Self {
        Self::default()
    }

    /// Requests now reading (holding READ_PROCEED).
    pub fn readers(&self) -> usize {
        self.read_queue.len()
    }

    /// Entries of the Update Queue (the update in progress or queued, and
    /// the reads queued behind it).
    pub fn update_queue_len(&self) -> usize {
        self.update_queue.len()
    }

    /// True if an update is queued or in progress.
    pub fn update_pending(&self) -> bool {
        !self.update_queue.is_empty()
    }

    /// True if nothing is queued: the document may be forgotten.
    pub fn is_idle(&self) -> bool {
        self.read_queue.is_empty() && self.update_queue.is_empty()
    }

    fn contains(&self, id: RequestId) -> bool {
        self.read_queue.contains(&id)
            || self.update_queue.iter().any(|q| matches!(q, Queued::Read(r) | Queued::Update(r) if *r == id))
    }

    /// Applies one IPC message by Table 1; returns the messages to send.
    pub fn handle(&mut self, ipc: Ipc) -> Result<Vec<Proceed>, Table1Error> {
        let read_empty = self.read_queue.is_empty();
        let update_empty = self.update_queue.is_empty();
        match ipc {
            Ipc::ReadRequest(id) | Ipc::UpdateRequest(id) if self.contains(id) => Err(Table1Error::Duplicate(id)),
            Ipc::ReadRequest(id) => {
                if update_empty {
                    self.read_queue.push_back(id);
                    Ok(vec![Proceed::Read(id)])
                } else {
                    self.update_queue.push_back(Queued::Read(id));
                    Ok(vec![])
                }
            }
            Ipc::ReadDone(id) => {
                if read_empty {
                    return Err(Table1Error::NotReading(id));
                }
                let position = self.read_queue.iter().position(|r| *r == id).ok_or(Table1Error::NotReading(id))?;
                self.read_queue.remove(position);
                match self.update_queue.front() {
                    Some(Queued::Update(update)) if self.read_queue.is_empty() => Ok(vec![Proceed::Update(*update)]),
                    _ => Ok(vec![]),
                }
            }
            Ipc::UpdateRequest(id) => {
                if !update_empty {
                    return Err(Table1Error::UpdatePending(id));
                }
                self.update_queue.push_back(Queued::Update(id));
                Ok(if read_empty { vec![Proceed::Update(id)] } else { vec![] })
            }
            Ipc::UpdateDone(id) => {
                if !read_empty || self.update_queue.front() != Some(&Queued::Update(id)) {
                    return Err(Table1Error::NotUpdating(id));
                }
                self.update_queue.pop_front();
                let mut proceeds = Vec::with_capacity(self.update_queue.len());
                while let Some(Queued::Read(read)) = self.update_queue.front().copied() {
                    self.update_queue.pop_front();
                    self.read_queue.push_back(read);
                    proceeds.push(Proceed::Read(read));
                }
                debug_assert!(self.update_queue.is_empty(), "only reads may follow the update");
                Ok(proceeds)
            }
        }
    }
}
