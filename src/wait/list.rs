//! An intrusive doubly linked list: the waiters' queue, with no allocation per waiter.
//!
//! # Implementation notes
//!
//! The list does not own its nodes. A node lives inside a pinned future; the list holds
//! raw pointers to it. Soundness rests on three rules, each stated where it is relied on:
//!
//! 1. A node is pinned (`PhantomPinned`) and is linked only through a pinned reference,
//!    so its address is stable while linked.
//! 2. The list and every node's link pointers are only touched by whoever holds the list
//!    (in paceline, the waiter queue's mutex). Link pointers live in an `UnsafeCell` and are
//!    reached through raw pointers, never through a `&mut Node` while linked, so a shared
//!    reference to the node held by its future stays valid.
//! 3. A node's owner unlinks it before the node's memory goes away: the waiting future's
//!    `Drop` takes the lock and removes its node (see `crate::wait::future`).
//!
//! This is the shape of tokio's `util::linked_list`, cut down to what the queue needs.

use core::marker::PhantomPinned;
use core::ptr::NonNull;

use crate::sync::UnsafeCell;

/// A node type that embeds [`Pointers`].
///
/// # Safety
///
/// `pointers` must return a pointer to the `Pointers<Self>` embedded in `*target`, derived
/// from `target` without creating a reference to the whole node.
pub(crate) unsafe trait Link: Sized {
    /// # Safety
    ///
    /// `target` must point to a live node.
    unsafe fn pointers(target: NonNull<Self>) -> NonNull<Pointers<Self>>;
}

/// The links embedded in every node.
pub(crate) struct Pointers<T> {
    inner: UnsafeCell<PointersInner<T>>,
}

struct PointersInner<T> {
    prev: Option<NonNull<T>>,
    next: Option<NonNull<T>>,
    /// A linked node must not move (rule 1).
    _pin: PhantomPinned,
}

impl<T> Pointers<T> {
    pub(crate) fn new() -> Pointers<T> {
        Pointers {
            inner: UnsafeCell::new(PointersInner {
                prev: None,
                next: None,
                _pin: PhantomPinned,
            }),
        }
    }
}

impl<T> core::fmt::Debug for Pointers<T> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str("Pointers")
    }
}

/// Reads a node's `prev`.
///
/// # Safety
///
/// `node` is live and the caller holds the list (rule 2).
unsafe fn prev<T: Link>(node: NonNull<T>) -> Option<NonNull<T>> {
    // SAFETY: the caller guarantees `node` is live; `Link` gives its embedded pointers.
    let pointers = unsafe { T::pointers(node) };
    // SAFETY: holding the list makes this the only access to the links (rule 2).
    unsafe { pointers.as_ref() }
        .inner
        .with(|p| unsafe { (*p).prev })
}

/// Reads a node's `next`.
///
/// # Safety
///
/// `node` is live and the caller holds the list (rule 2).
pub(crate) unsafe fn next<T: Link>(node: NonNull<T>) -> Option<NonNull<T>> {
    // SAFETY: the caller guarantees `node` is live; `Link` gives its embedded pointers.
    let pointers = unsafe { T::pointers(node) };
    // SAFETY: holding the list makes this the only access to the links (rule 2).
    unsafe { pointers.as_ref() }
        .inner
        .with(|p| unsafe { (*p).next })
}

/// Writes a node's `prev`.
///
/// # Safety
///
/// `node` is live and the caller holds the list (rule 2).
unsafe fn set_prev<T: Link>(node: NonNull<T>, prev: Option<NonNull<T>>) {
    // SAFETY: the caller guarantees `node` is live; `Link` gives its embedded pointers.
    let pointers = unsafe { T::pointers(node) };
    // SAFETY: holding the list makes this the only access to the links (rule 2).
    unsafe { pointers.as_ref() }
        .inner
        .with_mut(|p| unsafe { (*p).prev = prev });
}

/// Writes a node's `next`.
///
/// # Safety
///
/// `node` is live and the caller holds the list (rule 2).
unsafe fn set_next<T: Link>(node: NonNull<T>, next: Option<NonNull<T>>) {
    // SAFETY: the caller guarantees `node` is live; `Link` gives its embedded pointers.
    let pointers = unsafe { T::pointers(node) };
    // SAFETY: holding the list makes this the only access to the links (rule 2).
    unsafe { pointers.as_ref() }
        .inner
        .with_mut(|p| unsafe { (*p).next = next });
}

/// The list: a head and a tail pointer.
pub(crate) struct LinkedList<T: Link> {
    head: Option<NonNull<T>>,
    tail: Option<NonNull<T>>,
}

// SAFETY: the list holds pointers, not nodes; whoever holds the list (the queue's mutex)
// is the only party that follows them (rule 2), so moving the list to another thread is
// sound as long as the nodes themselves may be accessed from another thread (`T: Send`).
unsafe impl<T: Link + Send> Send for LinkedList<T> {}

impl<T: Link> core::fmt::Debug for LinkedList<T> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("LinkedList")
            .field("empty", &self.is_empty())
            .finish()
    }
}

impl<T: Link> LinkedList<T> {
    pub(crate) const fn new() -> LinkedList<T> {
        LinkedList {
            head: None,
            tail: None,
        }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.head.is_none()
    }

    pub(crate) fn front(&self) -> Option<NonNull<T>> {
        self.head
    }

    pub(crate) fn back(&self) -> Option<NonNull<T>> {
        self.tail
    }

    /// Links `node` at the back.
    ///
    /// # Safety
    ///
    /// `node` is live, pinned, in no list, and stays live until it is removed (rules 1, 3).
    pub(crate) unsafe fn push_back(&mut self, node: NonNull<T>) {
        // SAFETY: `node` is live and we hold the list (caller's contract).
        unsafe {
            set_prev(node, self.tail);
            set_next(node, None);
        }
        match self.tail {
            // SAFETY: the tail is a linked node, hence live (rule 3), and we hold the list.
            Some(tail) => unsafe { set_next(tail, Some(node)) },
            None => self.head = Some(node),
        }
        self.tail = Some(node);
    }

    /// Unlinks and returns the front node.
    pub(crate) fn pop_front(&mut self) -> Option<NonNull<T>> {
        let head = self.head?;
        // SAFETY: `head` is linked, so live (rule 3), and it is in this list.
        unsafe { self.remove(head) };
        Some(head)
    }

    /// Unlinks `node` if it is linked here; returns whether it was.
    ///
    /// # Safety
    ///
    /// `node` is live and is either in this list or in no list.
    pub(crate) unsafe fn remove(&mut self, node: NonNull<T>) -> bool {
        // SAFETY: `node` is live and we hold the list.
        let (prev, next) = unsafe { (prev(node), next(node)) };
        match prev {
            // SAFETY: a linked neighbour is live (rule 3).
            Some(prev) => unsafe { set_next(prev, next) },
            None => {
                if self.head != Some(node) {
                    // No predecessor and not the head: not linked.
                    return false;
                }
                self.head = next;
            }
        }
        match next {
            // SAFETY: a linked neighbour is live (rule 3).
            Some(next) => unsafe { set_prev(next, prev) },
            None => self.tail = prev,
        }
        // SAFETY: `node` is live; clearing its links marks it unlinked.
        unsafe {
            set_prev(node, None);
            set_next(node, None);
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::pin::Pin;

    struct Node {
        pointers: Pointers<Node>,
        value: u32,
    }

    // SAFETY: `pointers` projects to the embedded field with `&raw mut`, creating no
    // reference to the node.
    unsafe impl Link for Node {
        unsafe fn pointers(target: NonNull<Self>) -> NonNull<Pointers<Self>> {
            // SAFETY: `target` is live (caller's contract), so the field address is valid
            // and non-null.
            unsafe { NonNull::new_unchecked(&raw mut (*target.as_ptr()).pointers) }
        }
    }

    fn node(value: u32) -> Pin<Box<Node>> {
        Box::pin(Node {
            pointers: Pointers::new(),
            value,
        })
    }

    fn ptr(node: &Pin<Box<Node>>) -> NonNull<Node> {
        NonNull::from(&**node)
    }

    fn drain(list: &mut LinkedList<Node>) -> Vec<u32> {
        let mut out = Vec::new();
        while let Some(n) = list.pop_front() {
            // SAFETY: every node in these tests outlives the list's use of it.
            out.push(unsafe { n.as_ref() }.value);
        }
        out
    }

    #[test]
    fn fifo_order() {
        let nodes: Vec<_> = (0..5).map(node).collect();
        let mut list = LinkedList::new();
        for n in &nodes {
            // SAFETY: pinned boxes outlive the list's use of them.
            unsafe { list.push_back(ptr(n)) };
        }
        assert_eq!(drain(&mut list), vec![0, 1, 2, 3, 4]);
        assert!(list.is_empty());
    }

    #[test]
    fn remove_head_middle_tail_and_unlinked() {
        let nodes: Vec<_> = (0..5).map(node).collect();
        let mut list = LinkedList::new();
        for n in &nodes {
            // SAFETY: pinned boxes outlive the list's use of them.
            unsafe { list.push_back(ptr(n)) };
        }
        // SAFETY: all nodes are live and in this list (or already removed).
        unsafe {
            assert!(list.remove(ptr(&nodes[2])));
            assert!(!list.remove(ptr(&nodes[2])));
            assert!(list.remove(ptr(&nodes[0])));
            assert!(list.remove(ptr(&nodes[4])));
        }
        assert_eq!(drain(&mut list), vec![1, 3]);
        let lonely = node(9);
        // SAFETY: `lonely` is live and in no list.
        assert!(!unsafe { list.remove(ptr(&lonely)) });
    }

    #[test]
    fn a_removed_node_can_be_linked_again() {
        let a = node(1);
        let b = node(2);
        let mut list = LinkedList::new();
        // SAFETY: both nodes outlive the list's use of them.
        unsafe {
            list.push_back(ptr(&a));
            list.push_back(ptr(&b));
            assert!(list.remove(ptr(&a)));
            list.push_back(ptr(&a));
        }
        assert_eq!(drain(&mut list), vec![2, 1]);
    }
}
