//! The keyed shards' reader-writer lock under every interleaving loom can find: a reader
//! never sees half of a write, and every write lands. The protected value is two atomics
//! written and read with `Relaxed`, so only the lock's own orderings can make a reader
//! see both or neither.

#![cfg(loom)]

use loom::sync::atomic::{AtomicU64, Ordering::Relaxed};
use loom::sync::Arc;
use loom::thread;
use paceline::__loom::ReadMostly;

type Pair = (AtomicU64, AtomicU64);

fn write_once(lock: &ReadMostly<Pair>) {
    lock.write(|(a, b)| {
        a.store(a.load(Relaxed) + 1, Relaxed);
        b.store(b.load(Relaxed) + 1, Relaxed);
    });
}

fn read_pair(lock: &ReadMostly<Pair>) -> (u64, u64) {
    lock.read(|(a, b)| (a.load(Relaxed), b.load(Relaxed)))
}

/// A thread that reads the pair once and checks it is whole.
fn spawn_reader(lock: &Arc<ReadMostly<Pair>>) -> thread::JoinHandle<()> {
    let lock = lock.clone();
    thread::spawn(move || {
        let (a, b) = read_pair(&lock);
        assert_eq!(a, b, "a read saw half a write");
    })
}

/// A thread that writes the pair once.
fn spawn_writer(lock: &Arc<ReadMostly<Pair>>) -> thread::JoinHandle<()> {
    let lock = lock.clone();
    thread::spawn(move || write_once(&lock))
}

/// Every interleaving of `body` on a fresh lock with `slots` reader slots: the threads it
/// returns are joined in order, then the pair must show `writes` whole writes.
fn model_writes(
    slots: usize,
    writes: u64,
    body: fn(&Arc<ReadMostly<Pair>>) -> Vec<thread::JoinHandle<()>>,
) {
    loom::model(move || {
        let lock = Arc::new(ReadMostly::new(
            (AtomicU64::new(0), AtomicU64::new(0)),
            slots,
        ));
        for t in body(&lock) {
            t.join().unwrap();
        }
        assert_eq!(read_pair(&lock), (writes, writes));
    });
}

#[test]
fn two_readers_and_a_writer_on_one_slot() {
    // One slot: the readers contend for it with each other and with the writer.
    model_writes(1, 1, |lock| {
        let readers = (0..2).map(|_| spawn_reader(lock)).collect();
        write_once(lock);
        readers
    });
}

#[test]
fn readers_moving_to_a_second_slot_and_two_writers() {
    // Two slots, both readers start at slot 0 (the loom hint), so the second moves on;
    // two writers serialize and both writes land.
    model_writes(2, 2, |lock| {
        let reader = spawn_reader(lock);
        let writer = spawn_writer(lock);
        let (a, b) = read_pair(lock);
        assert_eq!(a, b, "a read saw half a write");
        write_once(lock);
        vec![reader, writer]
    });
}

#[test]
fn a_reader_in_the_shared_count_and_a_writer() {
    // The main thread holds the only slot while a reader and a writer start: the reader
    // then counts itself in the shared word (or, later, takes the slot), and the writer
    // must wait for it either way.
    model_writes(1, 1, |lock| {
        let (reader, writer) = lock.read(|_| (spawn_reader(lock), spawn_writer(lock)));
        vec![reader, writer]
    });
}
