/* How many GPUs this node may use, without linking CUDA: the node daemon must not load the
 * CUDA runtime (it has to outlive every rank crash), so `slots = auto` and `device = auto`
 * count what the NVIDIA driver lists under /proc/driver/nvidia/gpus (one folder per GPU,
 * named by PCI address) and narrow it by CUDA_VISIBLE_DEVICES as the CUDA runtime does. */
#ifndef CH_GPUS_H
#define CH_GPUS_H

#define CH_GPUS_PROC_DIR "/proc/driver/nvidia/gpus"

/* The number of GPUs a process started with CUDA_VISIBLE_DEVICES = visible would see, of the
 * `present` the driver lists. visible NULL: all of them. Otherwise the CUDA runtime's rules:
 * a comma-separated list of indices (or GPU-/MIG- UUID prefixes) read up to the first entry
 * that is invalid (not a number, out of range, negative or repeated), so "" and "-1" hide
 * every GPU and "0,7,1" on two GPUs gives 1. Never negative. */
int ch_gpus_visible(int present, const char *visible);

/* GPUs the driver lists in dir (CH_GPUS_PROC_DIR in the daemon, a scratch folder in tests):
 * the count of its entries that are not dot files; 0 when dir does not exist (no NVIDIA
 * driver). */
int ch_gpus_present(const char *dir);

#endif
