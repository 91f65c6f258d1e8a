/* Where a rank computes: the one spelling of the device in C. Strings ("cpu", "cuda")
 * exist only at the edges that carry text: the job file (train.device), workerd's and
 * chorusctl's --device, the CHORUS_DEVICE variable, the wire (NodeInfo.device) and the
 * coordinator's store; each converts with ch_device_parse / ch_device_name. */
#ifndef CH_DEVICE_H
#define CH_DEVICE_H

/* cuda: one GPU per rank, LOCAL_RANK -> device */
typedef enum { CH_DEVICE_CPU = 0, CH_DEVICE_CUDA = 1 } ch_device_t;

/* "cpu" | "cuda" */
const char *ch_device_name(ch_device_t d);
/* "cpu" or "cuda" to *d: 0, or CH_E_CONFIG for anything else (*d unchanged). */
int ch_device_parse(const char *s, ch_device_t *d);

#endif
