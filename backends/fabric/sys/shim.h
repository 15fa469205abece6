/* The libfabric calls ferry uses. Most of libfabric's API is `static inline`
 * functions that jump through an object's ops table; bindgen cannot bind
 * those, so each one used is wrapped here in a real function (ferry_*). */
#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_eq.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_rma.h>

uint32_t ferry_fi_version(void);
struct fi_info *ferry_fi_allocinfo(void);
int ferry_fi_close(struct fid *fid);
int ferry_fi_domain(struct fid_fabric *fabric, struct fi_info *info,
                    struct fid_domain **domain, void *context);
int ferry_fi_endpoint(struct fid_domain *domain, struct fi_info *info,
                      struct fid_ep **ep, void *context);
int ferry_fi_av_open(struct fid_domain *domain, struct fi_av_attr *attr,
                     struct fid_av **av, void *context);
int ferry_fi_av_insert(struct fid_av *av, const void *addr, size_t count,
                       fi_addr_t *fi_addr, uint64_t flags, void *context);
int ferry_fi_av_remove(struct fid_av *av, fi_addr_t *fi_addr, size_t count,
                       uint64_t flags);
int ferry_fi_cq_open(struct fid_domain *domain, struct fi_cq_attr *attr,
                     struct fid_cq **cq, void *context);
int ferry_fi_ep_bind(struct fid_ep *ep, struct fid *bfid, uint64_t flags);
int ferry_fi_mr_bind(struct fid_mr *mr, struct fid *bfid, uint64_t flags);
int ferry_fi_mr_enable(struct fid_mr *mr);
int ferry_fi_enable(struct fid_ep *ep);
int ferry_fi_getname(struct fid *fid, void *addr, size_t *addrlen);
int ferry_fi_mr_reg(struct fid_domain *domain, const void *buf, size_t len,
                    uint64_t access, uint64_t offset, uint64_t requested_key,
                    uint64_t flags, struct fid_mr **mr, void *context);
void *ferry_fi_mr_desc(struct fid_mr *mr);
uint64_t ferry_fi_mr_key(struct fid_mr *mr);
ssize_t ferry_fi_cq_read(struct fid_cq *cq, void *buf, size_t count);
ssize_t ferry_fi_cq_sread(struct fid_cq *cq, void *buf, size_t count,
                          const void *cond, int timeout);
ssize_t ferry_fi_cq_readerr(struct fid_cq *cq, struct fi_cq_err_entry *buf,
                            uint64_t flags);
const char *ferry_fi_cq_strerror(struct fid_cq *cq, int prov_errno,
                                 const void *err_data, char *buf, size_t len);
int ferry_fi_cq_signal(struct fid_cq *cq);
ssize_t ferry_fi_writemsg(struct fid_ep *ep, const struct fi_msg_rma *msg,
                          uint64_t flags);
ssize_t ferry_fi_readmsg(struct fid_ep *ep, const struct fi_msg_rma *msg,
                         uint64_t flags);
ssize_t ferry_fi_recv(struct fid_ep *ep, void *buf, size_t len, void *desc,
                      fi_addr_t src_addr, void *context);
