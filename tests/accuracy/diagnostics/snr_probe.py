#!/usr/bin/python3
"""Calibrators' flux_opt minus truth and local sky error in S/N bins. usage: snr_probe.py FIELD OUT"""
import sys, json, numpy as np
sys.path.insert(0, __import__('os').path.join(__import__('os').path.dirname(__import__('os').path.abspath(__file__)), '..'))
import evaluate as ev
from astropy.io import fits
field,out=sys.argv[1],sys.argv[2]
meta=json.load(open(field+'/FIELD.json'))
t=ev.load_truth(field); cat=fits.open(out+'/FRAME.cat.fits')[1].data; rep=json.load(open(out+'/FRAME.report.json'))
tid={int(v):i for i,v in enumerate(t['id'])}; rid=np.asarray(cat['ref_id'])
k=np.nonzero(rid>=0)[0]; i=np.array([tid[int(v)] for v in rid[k]])
fo=np.asarray(cat['flux_opt'],float)[k]; snr=fo/np.asarray(cat['fluxerr_opt'],float)[k]
flags=np.asarray(cat['flags'])[k]; cal=(flags&4096)!=0
dm=-2.5*np.log10(fo)+2.5*np.log10(t['flux'][i]); dsky=np.asarray(cat['sky'])[k]-meta['sky']
# truth isolation of these
print('%s zp-true %+.4f'%(out,rep['zp']-meta['zp']))
for a,b in [(20,30),(30,50),(50,100),(100,300),(300,1e9)]:
  q=cal&(snr>=a)&(snr<b)
  print('  calibrators S/N %4d-%-6g n %5d median inst-true %+.4f  mean %+.4f  sky err %+.2f ADU'%(a,b,q.sum(),np.median(dm[q]),np.mean(dm[q]),np.median(dsky[q])))
