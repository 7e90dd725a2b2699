//! The runtime's transport over MPI (MPICH through the `mpi` crate): the ring exchange of the
//! stage boundary is one `MPI_Sendrecv` to rank + 1 from rank - 1, so no rank can block another
//! whatever the order they arrive in; errors end the whole job with `MPI_Abort`, never a hang.

use mpi::collective::SystemOperation;
use mpi::point_to_point as p2p;
use mpi::topology::{Color, SimpleCommunicator};
use mpi::traits::*;
use ppc_runtime::comm::Transport;

pub struct Mpi {
    world: SimpleCommunicator,
    /// The ranks of this process's pipeline (all of them without replicas).
    pipe: SimpleCommunicator,
    /// The ranks that hold the same stages in every replica, by replica (with replicas only).
    across: Option<SimpleCommunicator>,
    rank: usize,
    size: usize,
    replica: usize,
}

// SAFETY: MPI is initialized at the "funneled" level and only the main thread calls the
// transport: generated code runs exchanges on the thread that called it, and the runtime's pool
// threads only multiply matrices.
unsafe impl Send for Mpi {}
unsafe impl Sync for Mpi {}

impl Mpi {
    /// The transport of a job of `replicas` pipelines of `world.size() / replicas` ranks each:
    /// world rank `w` is rank `w mod R` of pipeline `w / R`.
    pub fn new(world: SimpleCommunicator, replicas: usize) -> Mpi {
        let (w, n) = (world.rank() as usize, world.size() as usize);
        let per = n / replicas.max(1);
        let split = |color: usize| {
            world
                .split_by_color(Color::with_value(color as i32))
                .expect("invariant: every rank passes a color")
        };
        let (pipe, across) = if replicas > 1 {
            (split(w / per), Some(split(w % per)))
        } else {
            (world.duplicate(), None)
        };
        let (rank, size) = (pipe.rank() as usize, pipe.size() as usize);
        Mpi {
            world,
            pipe,
            across,
            rank,
            size,
            replica: w / per.max(1),
        }
    }
}

impl Transport for Mpi {
    fn rank(&self) -> usize {
        self.rank
    }

    fn size(&self) -> usize {
        self.size
    }

    fn exchange(&self, send: &[u8], recv: &mut [u8], reverse: bool) {
        let mut next = self
            .pipe
            .process_at_rank(((self.rank + 1) % self.size) as i32);
        let mut prev = self
            .pipe
            .process_at_rank(((self.rank + self.size - 1) % self.size) as i32);
        if reverse {
            std::mem::swap(&mut next, &mut prev);
        }
        p2p::send_receive_into(send, &next, recv, &prev);
    }

    fn gather(&self, values: &[f64]) -> Option<Vec<f64>> {
        let root = self.pipe.process_at_rank(0);
        if self.rank == 0 {
            let mut all = vec![0.0; values.len() * self.size];
            root.gather_into_root(values, &mut all[..]);
            Some(all)
        } else {
            root.gather_into(values);
            None
        }
    }

    fn max(&self, value: f64) -> f64 {
        let mut out = value;
        self.pipe
            .all_reduce_into(&value, &mut out, SystemOperation::max());
        out
    }

    fn barrier(&self) {
        self.world.barrier();
    }

    fn replica(&self) -> usize {
        self.replica
    }

    fn sum_across_replicas(&self, values: &mut [f32]) {
        let Some(across) = &self.across else { return };
        let root = across.process_at_rank(0);
        if self.replica == 0 {
            let mut all = vec![0.0f32; values.len() * across.size() as usize];
            root.gather_into_root(&values[..], &mut all[..]);
            // Left to right, replica by replica: the same bits on every run.
            for part in all.chunks(values.len()).skip(1) {
                for (v, p) in values.iter_mut().zip(part) {
                    *v += p;
                }
            }
        } else {
            root.gather_into(&values[..]);
        }
        root.broadcast_into(values);
    }

    fn all_gather_pipeline(&self, bytes: &[u8]) -> Vec<u8> {
        let mut all = vec![0u8; bytes.len() * self.size];
        self.pipe.all_gather_into(bytes, &mut all[..]);
        all
    }

    fn abort(&self, code: i32) -> ! {
        self.world.abort(code)
    }
}
