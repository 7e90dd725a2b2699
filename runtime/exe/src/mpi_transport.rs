//! The runtime's transport over MPI (MPICH through the `mpi` crate): the ring exchange of the
//! stage boundary is one `MPI_Sendrecv` to rank + 1 from rank - 1, so no rank can block another
//! whatever the order they arrive in; errors end the whole job with `MPI_Abort`, never a hang.

use mpi::collective::SystemOperation;
use mpi::point_to_point as p2p;
use mpi::topology::SimpleCommunicator;
use mpi::traits::*;
use ppc_runtime::comm::Transport;

pub struct Mpi {
    world: SimpleCommunicator,
    rank: usize,
    size: usize,
}

// SAFETY: MPI is initialized at the "funneled" level and only the main thread calls the
// transport: generated code runs exchanges on the thread that called it, and the runtime's pool
// threads only multiply matrices.
unsafe impl Send for Mpi {}
unsafe impl Sync for Mpi {}

impl Mpi {
    pub fn new(world: SimpleCommunicator) -> Mpi {
        let (rank, size) = (world.rank() as usize, world.size() as usize);
        Mpi { world, rank, size }
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
            .world
            .process_at_rank(((self.rank + 1) % self.size) as i32);
        let mut prev = self
            .world
            .process_at_rank(((self.rank + self.size - 1) % self.size) as i32);
        if reverse {
            std::mem::swap(&mut next, &mut prev);
        }
        p2p::send_receive_into(send, &next, recv, &prev);
    }

    fn gather(&self, values: &[f64]) -> Option<Vec<f64>> {
        let root = self.world.process_at_rank(0);
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
        self.world
            .all_reduce_into(&value, &mut out, SystemOperation::max());
        out
    }

    fn barrier(&self) {
        self.world.barrier();
    }

    fn abort(&self, code: i32) -> ! {
        self.world.abort(code)
    }
}
